// A split of `examples` pairs of random token ids for the data-parallel tests: lengths differ by
// index (some longer than a short test sequence, so they are cut), the same on every rank.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gpt2p/data/dataset_file.h"

namespace gpt2p::testing {

inline data::Split synthetic_split(int64_t examples, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int32_t> token(0, 50256);
  data::Split s;
  for (int64_t i = 0; i < examples; ++i) {
    std::vector<int32_t> src(static_cast<size_t>(1 + i % 4));
    std::vector<int32_t> tgt(static_cast<size_t>(1 + (i * 5) % 13));
    for (auto& t : src) t = token(gen);
    for (auto& t : tgt) t = token(gen);
    s.add(src, tgt, "de " + std::to_string(i), "en " + std::to_string(i));
  }
  return s;
}

}  // namespace gpt2p::testing
