// Batches exactly as HW5's collate_batch builds them, checked on hand-made examples.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "gpt2p/core/error.h"
#include "gpt2p/data/batch.h"
#include "gpt2p/data/bpe_tokenizer.h"

namespace gpt2p::data {
namespace {

const SpecialTokens kSpecial{90, 91, 99};

Split two_examples() {
  Split s;
  s.add({10, 11}, {20}, "de0", "en0");      // ids: 10 11 90 20 91
  s.add({12}, {21, 22, 23}, "de1", "en1");  // ids: 12 90 21 22 23 91
  return s;
}

TEST(Batch, TwoExamplesByHand) {
  const Batch b = make_batch(two_examples(), {0, 1}, 6, kSpecial);
  EXPECT_EQ(b.batch_size, 2);
  EXPECT_EQ(b.seq_len, 6);
  // Row 0: ids 10 11 90 20 91 99 99, mask 0 0 0 1 1 0 0
  // Row 1: ids 12 90 21 22 23 91 99, mask 0 0 1 1 1 1 0
  EXPECT_EQ(b.inputs, (std::vector<int64_t>{10, 11, 90, 20, 91, 99,  //
                                            12, 90, 21, 22, 23, 91}));
  EXPECT_EQ(b.labels, (std::vector<int64_t>{11, 90, 20, 91, 99, 99,  //
                                            90, 21, 22, 23, 91, 99}));
  EXPECT_EQ(b.mask, (std::vector<float>{0, 0, 1, 1, 0, 0,  //
                                        0, 1, 1, 1, 1, 0}));
  EXPECT_EQ(b.padded_tokens, 12);
  EXPECT_EQ(b.target_tokens, 6);  // (1 + eos) + (3 + eos)
}

TEST(Batch, TruncatesToMaxLenPlusOne) {
  // Row 1 cut to 4 ids: 12 90 21 22 (mask 0 0 1 1): <eos_en> is cut off.
  const Batch b = make_batch(two_examples(), {1}, 3, kSpecial);
  EXPECT_EQ(b.inputs, (std::vector<int64_t>{12, 90, 21}));
  EXPECT_EQ(b.labels, (std::vector<int64_t>{90, 21, 22}));
  EXPECT_EQ(b.mask, (std::vector<float>{0, 1, 1}));
  EXPECT_EQ(b.target_tokens, 2);
  // Cut inside the source: no target token at all.
  const Batch c = make_batch(two_examples(), {0}, 1, kSpecial);
  EXPECT_EQ(c.inputs, (std::vector<int64_t>{10}));
  EXPECT_EQ(c.labels, (std::vector<int64_t>{11}));
  EXPECT_EQ(c.mask, (std::vector<float>{0}));
  EXPECT_EQ(c.target_tokens, 0);
}

TEST(Batch, ExactFitHasNoPadding) {
  const Batch b = make_batch(two_examples(), {1}, 5, kSpecial);
  EXPECT_EQ(b.inputs, (std::vector<int64_t>{12, 90, 21, 22, 23}));
  EXPECT_EQ(b.labels, (std::vector<int64_t>{90, 21, 22, 23, 91}));
  EXPECT_EQ(b.mask, (std::vector<float>{0, 1, 1, 1, 1}));
}

TEST(Batch, OrderAndRepeatsFollowIndices) {
  const Batch b = make_batch(two_examples(), {1, 0, 1}, 6, kSpecial);
  EXPECT_EQ(b.batch_size, 3);
  EXPECT_EQ(b.inputs[0], 12);
  EXPECT_EQ(b.inputs[6], 10);
  EXPECT_EQ(b.inputs[12], 12);
  EXPECT_EQ(b.padded_tokens, 18);
  EXPECT_EQ(b.target_tokens, 4 + 2 + 4);
}

TEST(Batch, Errors) {
  std::string text;
  try {
    make_batch(two_examples(), {0, 2}, 6, kSpecial);
  } catch (const Error& e) {
    text = e.what();
  }
  EXPECT_NE(text.find("example index 2 is out of range [0, 2)"), std::string::npos) << text;
  try {
    make_batch(two_examples(), {0}, 0, kSpecial);
  } catch (const Error& e) {
    text = e.what();
  }
  EXPECT_NE(text.find("max_len 0 is too small"), std::string::npos) << text;
}

// A stand-in tokenizer that hands out ids from a counter.
struct CountingTokenizer {
  int32_t next;
  std::vector<std::string> seen;
  int32_t add_special_token(const std::string& t) {
    seen.push_back(t);
    return next++;
  }
};

TEST(SpecialTokens, RegisteredInOrderAndChecked) {
  CountingTokenizer ok{50257, {}};
  const auto s = register_special_tokens(ok);
  EXPECT_EQ(ok.seen, (std::vector<std::string>{"<eos_de>", "<eos_en>", "<pad>"}));
  EXPECT_EQ(s.eos_de, 50257);
  EXPECT_EQ(s.eos_en, 50258);
  EXPECT_EQ(s.pad, 50259);

  CountingTokenizer shifted{50258, {}};
  try {
    register_special_tokens(shifted);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("special token <eos_de> got id 50258 but 50257 was expected"),
        std::string::npos)
        << e.what();
  }
}

TEST(SpecialTokens, OnTheRealTokenizer) {
  const char* data = std::getenv("GPT2P_TEST_DATA");
  const auto dir =
      std::filesystem::path(data != nullptr ? data : "tests/data") / "../../.cache/gpt2-vocab";
  if (!std::filesystem::exists(dir / "encoder.json")) GTEST_SKIP() << "no GPT-2 vocab at " << dir;
  auto tok = BpeTokenizer::from_dir(dir.string());
  const auto s = register_special_tokens(tok);
  EXPECT_EQ(tok.vocab_size(), 50260);
  EXPECT_EQ(tok.token_id("<pad>"), s.pad);
  EXPECT_EQ(tok.encode_with_specials("a<eos_de>"), (std::vector<int32_t>{64, 50257}));
}

}  // namespace
}  // namespace gpt2p::data
