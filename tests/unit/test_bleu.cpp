// BLEU against cases computed by hand from sacreBLEU's definition (13a, exp smoothing).
#include <gtest/gtest.h>

#include <cmath>

#include "gpt2p/core/error.h"
#include "gpt2p/data/bleu.h"

using gpt2p::data::corpus_bleu;
using gpt2p::data::tokenize_13a;

TEST(Tokenize13a, SplitsPunctuationButNotNumbers) {
  EXPECT_EQ(tokenize_13a("Hello, world! It's 3.5-4 km."), "Hello , world ! It's 3.5 - 4 km .");
  EXPECT_EQ(tokenize_13a("1,000.50 euros"), "1,000.50 euros");
  EXPECT_EQ(tokenize_13a("&quot;hi&quot; &amp; (you)"), "\" hi \" & ( you )");
  EXPECT_EQ(tokenize_13a("  spaced \t out\n"), "spaced out");
  EXPECT_EQ(tokenize_13a("Grüße, Jürgen."), "Grüße , Jürgen .");
}

TEST(CorpusBleu, IdenticalIsHundred) {
  auto s = corpus_bleu({"the quick brown fox jumps"}, {"the quick brown fox jumps"});
  EXPECT_NEAR(s.score, 100.0, 1e-9);
  EXPECT_DOUBLE_EQ(s.brevity_penalty, 1.0);
}

TEST(CorpusBleu, ClassicCatExampleWithExpSmoothing) {
  // 1-grams 5/6, 2-grams 3/5, 3-grams 1/4, 4-grams 0/3 -> smoothed to 100 / (2 * 3).
  auto s = corpus_bleu({"the cat sat on the mat"}, {"the cat is on the mat"});
  const double expected = std::pow((500.0 / 6) * 60.0 * 25.0 * (100.0 / 6), 0.25);
  EXPECT_NEAR(s.score, expected, 1e-9);
  EXPECT_NEAR(s.precisions[0], 500.0 / 6, 1e-9);
  EXPECT_NEAR(s.precisions[3], 100.0 / 6, 1e-9);
}

TEST(CorpusBleu, BrevityPenalty) {
  auto s = corpus_bleu({"the cat sat on"}, {"the cat sat on the mat"});
  EXPECT_NEAR(s.brevity_penalty, std::exp(1.0 - 6.0 / 4.0), 1e-12);
  EXPECT_NEAR(s.score, 100.0 * std::exp(-0.5), 1e-9);
}

TEST(CorpusBleu, NoHigherOrderNgramsGivesZero) {
  EXPECT_DOUBLE_EQ(corpus_bleu({"the cat"}, {"the cat sat on the mat"}).score, 0.0);
  EXPECT_DOUBLE_EQ(corpus_bleu({""}, {"anything"}).score, 0.0);
}

TEST(CorpusBleu, PoolsCountsOverTheCorpus) {
  // Corpus BLEU is not the mean of sentence BLEUs: counts are summed first.
  auto s = corpus_bleu({"a b c d", "e f g h"}, {"a b c d", "e f x h"});
  // 1-grams 7/8, 2-grams 4/6, 3-grams 2/4, 4-grams 1/2.
  EXPECT_NEAR(s.score, std::pow(87.5 * (400.0 / 6) * 50.0 * 50.0, 0.25), 1e-9);
}

TEST(CorpusBleu, MismatchedCountsIsAnError) {
  try {
    corpus_bleu({"a"}, {});
    FAIL();
  } catch (const gpt2p::Error& e) {
    EXPECT_NE(std::string(e.what()).find("1 hypotheses but 0 references"), std::string::npos);
  }
}
