// Training batches for decoder-only translation, built exactly as HW5's collate_batch does.
//
// Per example: ids = src + [eos_de] + tgt + [eos_en], cut to max_len + 1 tokens, then padded with
// <pad> to max_len + 1. The target mask over those ids is
//     [0] * (len(src) + 1)  +  [1] * (len(tgt) + 1)  +  [0] * padding      (cut/padded the same
//     way)
// and the row is shifted:  inputs = ids[:-1],  labels = ids[1:],  mask = mask[1:].
// So mask[j] = 1 exactly when labels[j] is a target token or <eos_en>: the prediction of the first
// English token (made at the <eos_de> input position) counts, predicting German or <eos_de> does
// not, and padding never counts.
//
// Example (src = [10, 11], tgt = [20], eos_de = 90, eos_en = 91, pad = 99, max_len = 6):
//   ids    = 10 11 90 20 91 99 99
//   mask   =  0  0  0  1  1  0  0
//   inputs = 10 11 90 20 91 99
//   labels = 11 90 20 91 99 99
//   mask   =  0  0  1  1  0  0
#pragma once

#include <cstdint>
#include <vector>

#include "gpt2p/data/special_tokens.h"
#include "gpt2p/data/split.h"

namespace gpt2p::data {

struct Batch {
  int64_t batch_size = 0;
  int64_t seq_len = 0;          // = max_len; every row has this length
  std::vector<int64_t> inputs;  // row-major [batch_size, seq_len]
  std::vector<int64_t> labels;  // row-major [batch_size, seq_len]
  std::vector<float> mask;      // row-major [batch_size, seq_len], 1 = counts in the loss
  int64_t padded_tokens = 0;    // batch_size * seq_len, the token count HW5 reports
  int64_t target_tokens = 0;    // sum of mask
};

// The ids and target mask of one example before the shift (length max_len + 1).
void build_row(TokenSpan src, TokenSpan tgt, int64_t max_len, const SpecialTokens& special,
               std::vector<int64_t>& ids, std::vector<float>& mask);

// The target tokens make_batch counts for each of the split's first `pairs` examples (after the
// shift, so position 0 never counts).
std::vector<int64_t> target_counts(const Split& split, int64_t pairs, int64_t max_len,
                                   const SpecialTokens& special);

// The share of all positions (counts.size() rows of max_len) that those counts cover, in
// [1e-6, 1] (so that a cost scaled by it never vanishes); 1 for no rows.
double target_share(const std::vector<int64_t>& counts, int64_t max_len);

// Rows for split examples `indices` (any order, repeats allowed). max_len >= 1.
Batch make_batch(const Split& split, const std::vector<int64_t>& indices, int64_t max_len,
                 const SpecialTokens& special);

}  // namespace gpt2p::data
