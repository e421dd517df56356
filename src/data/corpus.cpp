#include "gpt2p/data/corpus.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <unordered_set>
#include <utility>

#include "gpt2p/core/error.h"
#include "gpt2p/core/fnv1a.h"
#include "gpt2p/io/json_input.h"

namespace gpt2p::data {

const std::vector<SentencePair>& SplitCorpus::get(const std::string& name) const {
  if (name == "train") return train;
  if (name == "validation") return validation;
  if (name == "test") return test;
  GPT2P_FAIL("unknown split '" << name << "'", "use one of train, validation, test");
}

std::vector<SentencePair>& SplitCorpus::get(const std::string& name) {
  return const_cast<std::vector<SentencePair>&>(std::as_const(*this).get(name));
}

std::string normalize_whitespace(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  bool pending_space = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    bool space = c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
    size_t width = 1;
    if (c == '\xC2' && i + 1 < text.size() && text[i + 1] == '\xA0') {  // U+00A0 no-break space
      space = true;
      width = 2;
    }
    if (space) {
      pending_space = !out.empty();
      i += width - 1;
      continue;
    }
    if (pending_space) out.push_back(' ');
    pending_space = false;
    out.push_back(c);
  }
  return out;
}

std::vector<SentencePair> dedupe(std::vector<SentencePair> pairs, int64_t* dropped) {
  std::unordered_set<std::string> seen;
  seen.reserve(pairs.size() * 2);
  std::vector<SentencePair> out;
  out.reserve(pairs.size());
  for (auto& p : pairs) {
    std::string key = p.de;
    key.push_back('\0');
    key += p.en;
    if (seen.insert(std::move(key)).second) out.push_back(std::move(p));
  }
  if (dropped != nullptr) *dropped = static_cast<int64_t>(pairs.size() - out.size());
  return out;
}

uint64_t pair_hash(const SentencePair& pair) {
  Fnv1a64 h;
  h.add(pair.de);
  h.add("\t");
  h.add(pair.en);
  return h.value();
}

const std::string& split_of(const SentencePair& pair, const SplitFractions& fractions) {
  GPT2P_CHECK(fractions.validation >= 0 && fractions.test >= 0 &&
                  fractions.validation + fractions.test < 1.0,
              "split fractions validation=" << fractions.validation << " test=" << fractions.test
                                            << " leave nothing for train",
              "use fractions >= 0 whose sum is below 1 (default 0.01 and 0.01)");
  constexpr uint64_t kBuckets = 1000000;
  const uint64_t bucket = pair_hash(pair) % kBuckets;
  const auto val_end = static_cast<uint64_t>(fractions.validation * kBuckets + 0.5);
  const auto test_end = val_end + static_cast<uint64_t>(fractions.test * kBuckets + 0.5);
  const auto& names = split_names();
  if (bucket < val_end) return names[1];
  if (bucket < test_end) return names[2];
  return names[0];
}

SplitCorpus split_by_hash(const std::vector<SentencePair>& pairs, const SplitFractions& fractions) {
  SplitCorpus out;
  for (const auto& p : pairs) out.get(split_of(p, fractions)).push_back(p);
  return out;
}

std::vector<SentencePair> read_jsonl(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  GPT2P_CHECK(in.good(), "cannot open JSONL file " << path,
              "pass an existing file of {\"translation\": {\"de\": ..., \"en\": ...}} lines");
  std::vector<SentencePair> out;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (normalize_whitespace(line).empty()) continue;
    const nlohmann::json row = io::parse_json(line, path + ":" + std::to_string(line_no),
                                              "each line must be one JSON object (JSON Lines)");
    const bool ok = row.is_object() && row.contains("translation") &&
                    row["translation"].is_object() && row["translation"].contains("de") &&
                    row["translation"].contains("en") && row["translation"]["de"].is_string() &&
                    row["translation"]["en"].is_string();
    GPT2P_CHECK(ok,
                path << ":" << line_no << ": expected {\"translation\": {\"de\": \"...\", "
                     << "\"en\": \"...\"}} but got " << line.substr(0, 200),
                "use the HW5 / Hugging Face iwslt14 de-en row format");
    SentencePair p{normalize_whitespace(row["translation"]["de"].get<std::string>()),
                   normalize_whitespace(row["translation"]["en"].get<std::string>())};
    if (p.de.empty() || p.en.empty()) continue;
    out.push_back(std::move(p));
  }
  return out;
}

namespace {
std::vector<std::string> read_lines(const std::string& path, const char* flag) {
  std::ifstream in(path, std::ios::binary);
  GPT2P_CHECK(in.good(), "cannot open " << flag << " file " << path,
              "pass an existing, readable text file to " << flag);
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(std::move(line));
  }
  return lines;
}
}  // namespace

std::vector<SentencePair> read_parallel(const std::string& de_path, const std::string& en_path) {
  const auto de = read_lines(de_path, "--de");
  const auto en = read_lines(en_path, "--en");
  GPT2P_CHECK(de.size() == en.size(),
              "parallel files differ in length: --de " << de_path << " has " << de.size()
                                                       << " lines but --en " << en_path << " has "
                                                       << en.size(),
              "line i of the German file must translate line i of the English file: fix the "
              "files so both have the same number of lines");
  std::vector<SentencePair> out;
  out.reserve(de.size());
  for (size_t i = 0; i < de.size(); ++i) {
    SentencePair p{normalize_whitespace(de[i]), normalize_whitespace(en[i])};
    if (!p.de.empty() && !p.en.empty()) out.push_back(std::move(p));
  }
  return out;
}

}  // namespace gpt2p::data
