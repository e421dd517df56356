// Greedy translation during training: it stops at <eos_en>, and otherwise after a budget derived
// from the reference's length rather than at seq_len.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "gpt2p/data/bpe_tokenizer.h"
#include "gpt2p/data/dataset_file.h"
#include "gpt2p/data/special_tokens.h"
#include "gpt2p/parallel/train/evaluator.h"

namespace gpt2p::parallel {
namespace {

constexpr int64_t kVocab = 50260;

// GPT2P_VOCAB_DIR, else the repository's .cache/gpt2-vocab (scripts/setup fetches it).
std::string vocab_dir() {
  const char* env = std::getenv("GPT2P_VOCAB_DIR");
  if (env != nullptr && *env != '\0') return env;
  const char* data = std::getenv("GPT2P_TEST_DATA");
  return std::string(data != nullptr ? data : "tests/data") + "/../../.cache/gpt2-vocab";
}

// A model whose next token is always `token`, except <eos_en> once the input has `eos_at` tokens
// (0: never). Counts its forward passes.
LogitsFn fixed_model(int64_t token, int64_t eos_at, int& calls) {
  return [=, &calls](const torch::Tensor& ids) {
    ++calls;
    auto logits = torch::zeros({ids.size(0), ids.size(1), kVocab + 4});
    const bool eos = eos_at > 0 && ids.size(1) >= eos_at;
    logits.select(2, eos ? data::SpecialTokens{}.eos_en : token).fill_(1.0);
    return logits;
  };
}

struct Fixture {
  data::Split split;
  data::BpeTokenizer tokenizer = data::BpeTokenizer::from_dir(vocab_dir());
  Fixture() {
    data::register_special_tokens(tokenizer);
    split.add({1, 2}, {3, 4, 5, 6}, "de", "en");  // 4 reference tokens: budget 4 + 2 + 8 = 14
  }
};

TEST(Translate, AModelThatNeverEndsStopsAfterTheReferenceBudget) {
  Fixture f;
  int calls = 0;
  const auto out = translate(fixed_model(7, 0, calls), f.split, 1, /*seq_len=*/256, {}, kVocab,
                             f.tokenizer, torch::Device(torch::kCPU));
  ASSERT_EQ(out.size(), 1U);
  EXPECT_EQ(calls, 14);
  EXPECT_EQ(out[0].hypothesis, f.tokenizer.decode(std::vector<int32_t>(14, 7)));
  EXPECT_EQ(out[0].reference, "en");
}

TEST(Translate, EosAndSeqLenBeforeTheBudgetGiveTheUnboundedResult) {
  Fixture f;
  int calls = 0;
  // Prompt: 2 German tokens + <eos_de>; <eos_en> comes once the input has 8 tokens.
  auto out = translate(fixed_model(7, 8, calls), f.split, 1, 256, {}, kVocab, f.tokenizer,
                       torch::Device(torch::kCPU));
  EXPECT_EQ(calls, 6);
  EXPECT_EQ(out[0].hypothesis, f.tokenizer.decode(std::vector<int32_t>(5, 7)));
  calls = 0;
  out = translate(fixed_model(7, 0, calls), f.split, 1, /*seq_len=*/10, {}, kVocab, f.tokenizer,
                  torch::Device(torch::kCPU));
  EXPECT_EQ(calls, 7);
  EXPECT_EQ(out[0].hypothesis, f.tokenizer.decode(std::vector<int32_t>(7, 7)));
}

}  // namespace
}  // namespace gpt2p::parallel
