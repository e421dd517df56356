#include "gpt2p/model/generate.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "gpt2p/compat/rng.h"
#include "gpt2p/core/error.h"

namespace gpt2p::model {
namespace {

void check(const std::vector<int64_t>& prompt, const Decoding& d) {
  GPT2P_CHECK(d.vocab_size >= 1, "decoding over a vocabulary of " << d.vocab_size << " tokens",
              "pass the model's vocab_size");
  GPT2P_CHECK(!prompt.empty(), "nothing to continue: the prompt has no tokens",
              "give at least one token");
  GPT2P_CHECK(static_cast<int64_t>(prompt.size()) < d.max_length,
              "the prompt has " << prompt.size() << " tokens, which leaves no room below the "
                                << "length limit of " << d.max_length,
              "shorten the prompt, or allow a longer sequence (the model's n_ctx at most)");
  GPT2P_CHECK(d.max_new >= 0, "at most " << d.max_new << " new tokens", "pass a count >= 0");
  GPT2P_CHECK(std::isfinite(d.temperature) && d.temperature >= 0,
              "temperature " << d.temperature << " is out of range",
              "pass 0 for greedy decoding or a positive temperature to sample");
  GPT2P_CHECK(d.top_k >= 0, "top-k " << d.top_k << " is out of range",
              "pass a count >= 1, or 0 for the whole vocabulary");
}

// The next token from the last position's logits [V] (float32 on the CPU).
int64_t pick(const torch::Tensor& last, const Decoding& d, at::Generator& generator) {
  if (d.temperature == 0) return last.argmax(-1).item<int64_t>();
  auto scaled = last.to(torch::kFloat64) / d.temperature;
  if (d.top_k > 0 && d.top_k < scaled.size(0)) {
    const auto kth = std::get<0>(scaled.topk(d.top_k)).min();
    scaled = scaled.masked_fill(scaled < kth, -std::numeric_limits<double>::infinity());
  }
  const auto probs = torch::softmax(scaled, -1);
  return torch::multinomial(probs, 1, /*replacement=*/false, generator).item<int64_t>();
}

}  // namespace

Generated generate(const NextLogitsFn& logits, const std::vector<int64_t>& prompt,
                   const Decoding& decoding, const torch::Device& device) {
  check(prompt, decoding);
  torch::NoGradGuard no_grad;
  at::Generator generator = compat::make_cpu_generator(decoding.seed);
  std::vector<int64_t> ids = prompt;
  Generated out;
  while (true) {
    if (static_cast<int64_t>(ids.size()) >= decoding.max_length) {
      out.reason = StopReason::kMaxLength;
      break;
    }
    if (decoding.max_new > 0 && static_cast<int64_t>(out.tokens.size()) >= decoding.max_new) {
      out.reason = StopReason::kMaxNew;
      break;
    }
    const auto input =
        torch::from_blob(ids.data(), {1, static_cast<int64_t>(ids.size())}, torch::kInt64)
            .to(device, /*non_blocking=*/false, /*copy=*/true);
    const auto last = logits(input)
                          .select(1, -1)
                          .select(0, 0)
                          .narrow(-1, 0, decoding.vocab_size)
                          .to(torch::kCPU, torch::kFloat32);
    const int64_t next = pick(last, decoding, generator);
    if (next == decoding.stop_token) {
      out.reason = StopReason::kStopToken;
      break;
    }
    ids.push_back(next);
    out.tokens.push_back(next);
  }
  return out;
}

}  // namespace gpt2p::model
