#include "gpt2p/parallel/train/evaluator.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "gpt2p/data/batch.h"
#include "gpt2p/data/bleu.h"
#include "gpt2p/model/gpt2.h"

namespace gpt2p::parallel {
namespace {

torch::Tensor to_device(const std::vector<int64_t>& v, int64_t rows, int64_t cols,
                        const torch::Device& device) {
  return torch::from_blob(const_cast<int64_t*>(v.data()), {rows, cols}, torch::kInt64)
      .to(device, /*non_blocking=*/false, /*copy=*/true);
}

// The most tokens greedy decoding generates for a reference of `reference_tokens`: half again as
// many plus a few. A hypothesis that long is already a poor translation, and an untrained model
// (which rarely emits <eos_en>) then stops long before filling seq_len, each step being a full
// forward pass.
int64_t generation_budget(size_t reference_tokens) {
  const auto n = static_cast<int64_t>(reference_tokens);
  return n + n / 2 + 8;
}

}  // namespace

LossResult validation_loss(const LogitsFn& logits, const data::Split& split, int64_t max_pairs,
                           int64_t batch_size, int64_t seq_len, const data::SpecialTokens& special,
                           int64_t vocab_size, const torch::Device& device,
                           comm::Communicator* comm, const StopPredicate& stop) {
  torch::NoGradGuard no_grad;
  const int64_t n = max_pairs > 0 ? std::min(max_pairs, split.size()) : split.size();
  const int rank = comm != nullptr ? comm->rank() : 0;
  const int world = comm != nullptr ? comm->size() : 1;
  std::vector<int64_t> mine;
  for (int64_t i = rank; i < n; i += world) mine.push_back(i);
  double sum = 0;
  double count = 0;
  // Every rank asks `stop` once per batch of the busiest rank (rank 0: ceil(n / world) examples).
  const auto busiest = static_cast<size_t>((n + world - 1) / world);
  for (size_t b = 0; b < std::max(busiest, mine.size()); b += static_cast<size_t>(batch_size)) {
    if (stop && stop()) {
      LossResult r;
      r.stopped = true;
      r.loss = r.perplexity = std::numeric_limits<double>::quiet_NaN();
      return r;
    }
    if (b >= mine.size()) continue;
    std::vector<int64_t> idx(mine.begin() + static_cast<long>(b),
                             mine.begin() + static_cast<long>(std::min(
                                                mine.size(), b + static_cast<size_t>(batch_size))));
    auto batch = data::make_batch(split, idx, seq_len, special);
    if (batch.target_tokens == 0) continue;
    const auto rows = batch.batch_size;
    auto inputs = to_device(batch.inputs, rows, seq_len, device);
    auto labels = to_device(batch.labels, rows, seq_len, device);
    auto mask = torch::from_blob(batch.mask.data(), {rows, seq_len}, torch::kFloat32).to(device);
    auto mean = model::lm_loss(logits(inputs), labels, mask, vocab_size);
    sum += mean.item<double>() * static_cast<double>(batch.target_tokens);
    count += static_cast<double>(batch.target_tokens);
  }
  if (comm != nullptr && world > 1) {
    auto totals = torch::tensor({sum, count}, torch::TensorOptions().dtype(torch::kFloat64))
                      .to(comm->device());
    comm->all_reduce(totals, comm::ReduceOp::kSum);
    totals = totals.cpu();
    sum = totals[0].item<double>();
    count = totals[1].item<double>();
  }
  LossResult r;
  r.tokens = static_cast<int64_t>(count);
  r.loss = count > 0 ? sum / count : std::numeric_limits<double>::quiet_NaN();
  r.perplexity = std::exp(r.loss);
  return r;
}

SentenceTranslation translate_ids(const LogitsFn& logits, const std::vector<int32_t>& source,
                                  model::Decoding decoding, const data::SpecialTokens& special,
                                  const data::BpeTokenizer& tokenizer,
                                  const torch::Device& device) {
  std::vector<int64_t> ids(source.begin(), source.end());
  // Leave room for at least a few generated tokens.
  if (static_cast<int64_t>(ids.size()) > decoding.max_length / 2) {
    ids.resize(static_cast<size_t>(decoding.max_length / 2));
  }
  SentenceTranslation out;
  out.source_tokens_kept = ids.size();
  ids.push_back(special.eos_de);
  if (static_cast<int64_t>(ids.size()) >= decoding.max_length) {
    out.reason = model::StopReason::kMaxLength;
    return out;
  }
  decoding.stop_token = special.eos_en;
  const auto generated = model::generate(logits, ids, decoding, device);
  out.text = tokenizer.decode_without_added(generated.tokens);
  out.tokens = static_cast<int64_t>(generated.tokens.size());
  out.reason = generated.reason;
  return out;
}

std::vector<Translation> translate(const LogitsFn& logits, const data::Split& split, int n,
                                   int64_t seq_len, const data::SpecialTokens& special,
                                   int64_t vocab_size, const data::BpeTokenizer& tokenizer,
                                   const torch::Device& device, const StopPredicate& stop) {
  std::vector<Translation> out;
  const int64_t count = std::min<int64_t>(n, split.size());
  for (int64_t i = 0; i < count; ++i) {
    if (stop && stop()) break;
    model::Decoding decoding;
    decoding.vocab_size = vocab_size;
    decoding.max_length = seq_len;
    decoding.max_new = generation_budget(split.tgt(i).size());
    const auto t =
        translate_ids(logits, split.src(i).to_vector(), decoding, special, tokenizer, device);
    out.push_back({split.text_de(i), t.text, split.text_en(i)});
  }
  return out;
}

double translations_bleu(const std::vector<Translation>& translations) {
  if (translations.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::vector<std::string> hyp;
  std::vector<std::string> ref;
  for (const auto& t : translations) {
    hyp.push_back(t.hypothesis);
    ref.push_back(t.reference);
  }
  return data::corpus_bleu(hyp, ref).score;
}

}  // namespace gpt2p::parallel
