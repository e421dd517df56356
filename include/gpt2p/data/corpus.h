// Parallel German->English sentence pairs: readers for the non-Ding sources (HW5's iwslt14 JSONL
// rows and plain line-aligned text files), exact dedupe and the fixed train/validation/test split.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gpt2p::data {

struct SentencePair {
  std::string de;
  std::string en;
  bool operator==(const SentencePair& o) const { return de == o.de && en == o.en; }
};

// The three split names, in file order.
inline const std::vector<std::string>& split_names() {
  static const std::vector<std::string> names{"train", "validation", "test"};
  return names;
}

struct SplitFractions {
  double validation = 0.01;
  double test = 0.01;  // train gets the rest
};

struct SplitCorpus {
  std::vector<SentencePair> train, validation, test;

  // By name ("train", "validation", "test"); throws naming the valid names otherwise.
  const std::vector<SentencePair>& get(const std::string& name) const;
  std::vector<SentencePair>& get(const std::string& name);
};

// Collapses every run of whitespace (incl. tabs, newlines, NBSP U+00A0) to one space and trims.
std::string normalize_whitespace(const std::string& text);

// Keeps the first occurrence of every exact (de, en) pair, preserving order. Returns how many were
// dropped through `*dropped` when given.
std::vector<SentencePair> dedupe(std::vector<SentencePair> pairs, int64_t* dropped = nullptr);

// 64-bit FNV-1a of "de\ten": a hash that is the same on every machine, compiler and run.
uint64_t pair_hash(const SentencePair& pair);

// Which split a pair belongs to: bucket = pair_hash % 1'000'000; the first `validation` fraction
// of buckets -> "validation", the next `test` fraction -> "test", the rest -> "train". A pair's
// split depends only on its text, so it never moves when the corpus grows or is cut.
const std::string& split_of(const SentencePair& pair, const SplitFractions& fractions);

// Distributes `pairs` by split_of, keeping their relative order.
SplitCorpus split_by_hash(const std::vector<SentencePair>& pairs, const SplitFractions& fractions);

// HW5 / Hugging Face iwslt14 rows, one JSON object per line: {"translation": {"de": .., "en": ..}}.
// Blank lines are skipped; a malformed line is an error naming file:line.
std::vector<SentencePair> read_jsonl(const std::string& path);

// Two line-aligned text files (line i of `de_path` translates line i of `en_path`). Different line
// counts are an error naming both counts. Pairs with an empty side are skipped.
std::vector<SentencePair> read_parallel(const std::string& de_path, const std::string& en_path);

}  // namespace gpt2p::data
