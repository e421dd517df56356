// Corpus BLEU exactly as sacreBLEU computes it by default: 13a tokenisation, n-grams 1..4,
// one reference per hypothesis, brevity penalty, 'exp' smoothing; score in [0, 100].
#pragma once

#include <string>
#include <vector>

namespace gpt2p::data {

// sacreBLEU's tokenizer_13a (mteval-v13a): unescape a few entities, split punctuation/symbols,
// periods and commas not next to digits, and dashes after digits; collapse whitespace.
std::string tokenize_13a(const std::string& line);

struct BleuScore {
  double score = 0;                // 0..100
  std::vector<double> precisions;  // 4 n-gram precisions, in percent (after smoothing)
  double brevity_penalty = 0;
  long long sys_len = 0;
  long long ref_len = 0;
};

BleuScore corpus_bleu(const std::vector<std::string>& hypotheses,
                      const std::vector<std::string>& references);

}  // namespace gpt2p::data
