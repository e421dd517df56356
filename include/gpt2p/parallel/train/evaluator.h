// Evaluation during training: validation loss/perplexity over the ranks, and greedy translations
// of a few test pairs scored with corpus BLEU. The model is reached through a function so that the
// same code serves a whole model and a pipeline.
#pragma once

#include <torch/types.h>

#include <functional>
#include <string>
#include <vector>

#include "gpt2p/comm/communicator.h"
#include "gpt2p/data/bpe_tokenizer.h"
#include "gpt2p/data/dataset_file.h"
#include "gpt2p/data/special_tokens.h"
#include "gpt2p/model/generate.h"

namespace gpt2p::parallel {

// Token ids [B,T] int64 on the model's device -> logits [B,T,V'] (V' >= vocab_size).
using LogitsFn = std::function<torch::Tensor(const torch::Tensor& ids)>;

struct LossResult {
  double loss = 0;        // mean masked cross-entropy over all evaluated target tokens
  double perplexity = 0;  // exp(loss)
  int64_t tokens = 0;
  bool stopped = false;  // `stop` said so: ended early, loss NaN
};

// Asked before each batch; every rank asks it the same number of times (an agreed stop check).
using StopPredicate = std::function<bool()>;

// The first `max_pairs` (0 = all) examples of `split`, shared round-robin over the communicator's
// ranks (comm may be null: this rank does all); sums are all-reduced, so every rank gets the
// result. `stop` (when set) is asked before each of as many batches as the busiest rank has, on
// every rank; when it answers true every rank returns at once with `stopped` set.
LossResult validation_loss(const LogitsFn& logits, const data::Split& split, int64_t max_pairs,
                           int64_t batch_size, int64_t seq_len, const data::SpecialTokens& special,
                           int64_t vocab_size, const torch::Device& device,
                           comm::Communicator* comm, const StopPredicate& stop = {});

struct Translation {
  std::string source, hypothesis, reference;
};

struct SentenceTranslation {
  std::string text;               // the generated tokens' text (specials dropped)
  int64_t tokens = 0;             // tokens generated, <eos_en> not counted
  size_t source_tokens_kept = 0;  // of the source's, at most half of decoding.max_length
  model::StopReason reason = model::StopReason::kStopToken;
};

// One German sentence's token ids -> English: the source (cut to half of decoding.max_length,
// leaving room to generate) + <eos_de>, then tokens as `decoding` says (its stop_token is set to
// <eos_en> here) until <eos_en>, decoding.max_new tokens or decoding.max_length in all.
SentenceTranslation translate_ids(const LogitsFn& logits, const std::vector<int32_t>& source,
                                  model::Decoding decoding, const data::SpecialTokens& special,
                                  const data::BpeTokenizer& tokenizer, const torch::Device& device);

// Greedy decoding of the first `n` examples of `split`: German + <eos_de>, then argmax tokens until
// <eos_en>, seq_len tokens in all, or 1.5 x the reference's token count + 8 generated tokens
// (whichever comes first; the tokens before the bound are those an unbounded decoding gives).
// `stop` (when set, asked before each example by this rank alone) ends it early: the
// translations so far are returned.
std::vector<Translation> translate(const LogitsFn& logits, const data::Split& split, int n,
                                   int64_t seq_len, const data::SpecialTokens& special,
                                   int64_t vocab_size, const data::BpeTokenizer& tokenizer,
                                   const torch::Device& device, const StopPredicate& stop = {});

// Corpus BLEU (sacreBLEU default) of the translations; NaN when there are none.
double translations_bleu(const std::vector<Translation>& translations);

}  // namespace gpt2p::parallel
