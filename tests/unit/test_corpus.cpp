// JSONL / parallel-text readers, whitespace, dedupe and the hash split.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <string>

#include "gpt2p/core/error.h"
#include "gpt2p/data/corpus.h"
#include "support/errors.h"

namespace gpt2p::data {
namespace {

using gpt2p::testing::error_with_hint;

std::string fixture(const std::string& name) {
  const char* dir = std::getenv("GPT2P_TEST_DATA");
  return std::string(dir != nullptr ? dir : "tests/data") + "/corpus/" + name;
}

TEST(Corpus, NormalizeWhitespace) {
  EXPECT_EQ(normalize_whitespace("  a \t b\n\nc  "), "a b c");
  EXPECT_EQ(normalize_whitespace("a\xC2\xA0\xC2\xA0"
                                 "b"),
            "a b");
  EXPECT_EQ(normalize_whitespace("Größe  ß"), "Größe ß");
  EXPECT_EQ(normalize_whitespace(" \t\n"), "");
}

TEST(Corpus, DedupeKeepsFirstInOrder) {
  std::vector<SentencePair> in{{"a", "x"}, {"b", "y"}, {"a", "x"}, {"a", "y"}, {"b", "y"}};
  int64_t dropped = -1;
  const auto out = dedupe(in, &dropped);
  EXPECT_EQ(out, (std::vector<SentencePair>{{"a", "x"}, {"b", "y"}, {"a", "y"}}));
  EXPECT_EQ(dropped, 2);
  // (de, en) is the key: "a\0x" style collisions between fields do not merge pairs.
  EXPECT_EQ(dedupe({{"ab", "c"}, {"a", "bc"}}).size(), 2U);
}

TEST(Corpus, HashIsFixedAcrossRuns) {
  // FNV-1a 64 of "de\ten", checked against an independent computation of the empty pair.
  EXPECT_EQ(pair_hash({"", ""}), (14695981039346656037ULL ^ 0x09ULL) * 1099511628211ULL);
  EXPECT_NE(pair_hash({"a", "b"}), pair_hash({"b", "a"}));
}

TEST(Corpus, SplitIsDeterministicAndNearFractions) {
  std::vector<SentencePair> pairs;
  for (int i = 0; i < 20000; ++i) pairs.push_back({"Satz " + std::to_string(i), "sentence"});
  const SplitFractions f{0.05, 0.10};
  const auto a = split_by_hash(pairs, f);
  const auto b = split_by_hash(pairs, f);
  EXPECT_EQ(a.train, b.train);
  EXPECT_EQ(a.validation, b.validation);
  EXPECT_EQ(a.test, b.test);
  EXPECT_EQ(a.train.size() + a.validation.size() + a.test.size(), pairs.size());
  EXPECT_NEAR(static_cast<double>(a.validation.size()) / 20000, 0.05, 0.01);
  EXPECT_NEAR(static_cast<double>(a.test.size()) / 20000, 0.10, 0.01);
  // A pair's split does not depend on the rest of the corpus (cutting the corpus moves nothing).
  const std::vector<SentencePair> half(pairs.begin(), pairs.begin() + 10000);
  const auto c = split_by_hash(half, f);
  for (const auto& p : c.validation) EXPECT_EQ(split_of(p, f), "validation");
  std::set<std::string> val_a;
  for (const auto& p : a.validation) val_a.insert(p.de);
  for (const auto& p : c.validation) EXPECT_EQ(val_a.count(p.de), 1U) << p.de;
}

TEST(Corpus, SplitRejectsBadFractions) {
  const auto text = error_with_hint([] { split_of({"a", "b"}, SplitFractions{0.6, 0.5}); });
  EXPECT_NE(text.find("validation=0.6 test=0.5"), std::string::npos) << text;
}

TEST(Corpus, SplitCorpusGetByName) {
  SplitCorpus c;
  c.get("test").push_back({"a", "b"});
  EXPECT_EQ(c.test.size(), 1U);
  const auto text = error_with_hint([&] { c.get("dev"); });
  EXPECT_NE(text.find("unknown split 'dev'"), std::string::npos) << text;
}

TEST(Corpus, ReadJsonl) {
  const auto pairs = read_jsonl(fixture("iwslt_sample.jsonl"));
  ASSERT_EQ(pairs.size(), 3U);
  EXPECT_EQ(pairs[0], (SentencePair{"Vielen Dank, Chris.", "Thank you so much, Chris."}));
  EXPECT_EQ(pairs[1].de,
            "Es ist mir wirklich eine Ehre, zweimal auf dieser Bühne stehen zu dürfen.");
  EXPECT_EQ(pairs[2].en, "I'm extremely grateful.");
}

TEST(Corpus, ReadJsonlErrorsNameFileAndLine) {
  const auto path = fixture("iwslt_bad_row.jsonl");
  const auto text = error_with_hint([&] { read_jsonl(path); });
  EXPECT_NE(text.find(path + ":2:"), std::string::npos) << text;
  EXPECT_NE(text.find("\"translation\""), std::string::npos) << text;

  const std::string broken =
      ::testing::TempDir() + "/broken_" + std::to_string(::getpid()) + ".jsonl";
  std::ofstream(broken) << "{\"translation\": {\"de\": \"a\", \"en\": \"b\"}}\n{not json\n";
  const auto text2 = error_with_hint([&] { read_jsonl(broken); });
  EXPECT_NE(text2.find(broken + ":2: not valid JSON"), std::string::npos) << text2;

  const auto text3 = error_with_hint([] { read_jsonl("/nonexistent/x.jsonl"); });
  EXPECT_NE(text3.find("cannot open JSONL file /nonexistent/x.jsonl"), std::string::npos) << text3;
}

TEST(Corpus, ReadParallel) {
  const auto pairs = read_parallel(fixture("parallel_sample.de"), fixture("parallel_sample.en"));
  ASSERT_EQ(pairs.size(), 3U);  // the empty line pair is skipped
  EXPECT_EQ(pairs[0], (SentencePair{"Guten Morgen.", "Good morning."}));
  EXPECT_EQ(pairs[2], (SentencePair{"Danke.", "Thanks."}));
}

TEST(Corpus, ReadParallelLineCountMismatch) {
  const auto text = error_with_hint(
      [] { read_parallel(fixture("parallel_sample.de"), fixture("parallel_short.en")); });
  EXPECT_NE(text.find("has 4 lines but --en"), std::string::npos) << text;
  EXPECT_NE(text.find("has 2"), std::string::npos) << text;
  EXPECT_NE(text.find("same number of lines"), std::string::npos) << text;
  const auto missing =
      error_with_hint([] { read_parallel("/nonexistent.de", fixture("parallel_short.en")); });
  EXPECT_NE(missing.find("cannot open --de file /nonexistent.de"), std::string::npos) << missing;
}

}  // namespace
}  // namespace gpt2p::data
