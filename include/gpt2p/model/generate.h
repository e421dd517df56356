// Decoding from a language model, one token at a time: greedy (the highest logit) or sampled
// (softmax at a temperature, optionally over the k highest logits only). Every step runs the model
// over the whole sequence so far (no key/value cache): enough for sentences and short texts.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace gpt2p::model {

// Token ids [1,T] int64 on the model's device -> logits [1,T,V'] (V' >= the vocabulary).
using NextLogitsFn = std::function<torch::Tensor(const torch::Tensor& ids)>;

struct Decoding {
  int64_t vocab_size = 0;   // logit columns that are tokens (the rest is padding)
  int64_t max_length = 0;   // the sequence (prompt + generated) never grows past this
  int64_t max_new = 0;      // at most this many generated tokens (0: up to max_length)
  int64_t stop_token = -1;  // generation ends when this token comes (not returned); -1: none
  double temperature = 0;   // 0: greedy; > 0: sample from softmax(logits / temperature)
  int64_t top_k = 0;        // sampling: only the k most likely tokens (0: all)
  uint64_t seed = 0;        // sampling: the generator's seed (the same seed, the same text)
};

enum class StopReason { kStopToken, kMaxNew, kMaxLength };

struct Generated {
  std::vector<int64_t> tokens;  // generated after the prompt, without the stop token
  StopReason reason = StopReason::kMaxLength;
};

// Continues `prompt` (1 <= size < max_length) on `device`. Sampling draws on the CPU from its own
// generator, so a seed gives the same tokens on every device whose logits agree. Throws
// gpt2p::Error for a prompt that leaves no room, or settings out of range.
Generated generate(const NextLogitsFn& logits, const std::vector<int64_t>& prompt,
                   const Decoding& decoding, const torch::Device& device);

}  // namespace gpt2p::model
