#include "gpt2p/data/batch.h"

#include <algorithm>
#include <numeric>

#include "gpt2p/core/error.h"

namespace gpt2p::data {

void build_row(TokenSpan src, TokenSpan tgt, int64_t max_len, const SpecialTokens& special,
               std::vector<int64_t>& ids, std::vector<float>& mask) {
  GPT2P_CHECK(max_len >= 1, "max_len " << max_len << " is too small",
              "pass a maximum sequence length >= 1 (e.g. --max-len 128)");
  const auto row = static_cast<size_t>(max_len + 1);
  ids.clear();
  mask.clear();
  ids.reserve(row);
  mask.reserve(row);
  auto push = [&](int64_t id, float m) {
    if (ids.size() < row) {
      ids.push_back(id);
      mask.push_back(m);
    }
  };
  for (const int32_t t : src) push(t, 0.0F);
  push(special.eos_de, 0.0F);
  for (const int32_t t : tgt) push(t, 1.0F);
  push(special.eos_en, 1.0F);
  while (ids.size() < row) push(special.pad, 0.0F);
}

Batch make_batch(const Split& split, const std::vector<int64_t>& indices, int64_t max_len,
                 const SpecialTokens& special) {
  Batch b;
  b.batch_size = static_cast<int64_t>(indices.size());
  b.seq_len = max_len;
  const auto n = static_cast<size_t>(b.batch_size * max_len);
  b.inputs.reserve(n);
  b.labels.reserve(n);
  b.mask.reserve(n);
  std::vector<int64_t> ids;
  std::vector<float> mask;
  for (const int64_t i : indices) {
    build_row(split.src(i), split.tgt(i), max_len, special, ids, mask);
    b.inputs.insert(b.inputs.end(), ids.begin(), ids.end() - 1);
    b.labels.insert(b.labels.end(), ids.begin() + 1, ids.end());
    b.mask.insert(b.mask.end(), mask.begin() + 1, mask.end());
  }
  b.padded_tokens = b.batch_size * b.seq_len;
  double sum = 0;
  for (const float m : b.mask) sum += m;
  b.target_tokens = static_cast<int64_t>(sum);
  return b;
}

std::vector<int64_t> target_counts(const Split& split, int64_t pairs, int64_t max_len,
                                   const SpecialTokens& special) {
  std::vector<int64_t> counts(static_cast<size_t>(std::max<int64_t>(0, pairs)));
  std::vector<int64_t> ids;
  std::vector<float> mask;
  for (int64_t i = 0; i < pairs; ++i) {
    build_row(split.src(i), split.tgt(i), max_len, special, ids, mask);
    counts[static_cast<size_t>(i)] =
        static_cast<int64_t>(std::accumulate(mask.begin() + 1, mask.end(), 0.0f));
  }
  return counts;
}

double target_share(const std::vector<int64_t>& counts, int64_t max_len) {
  if (counts.empty() || max_len < 1) return 1.0;
  const auto total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  const double share = static_cast<double>(total) /
                       (static_cast<double>(counts.size()) * static_cast<double>(max_len));
  return std::clamp(share, 1e-6, 1.0);
}

}  // namespace gpt2p::data
