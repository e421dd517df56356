// Small GPT-2 configurations for tests: the tiny preset with `blocks` blocks, no dropout (runs
// compare exactly) and a small vocabulary (a fast head); width, heads and context optionally
// smaller still (-1 keeps the preset's).
#pragma once

#include <cstdint>

#include "gpt2p/model/config.h"

namespace gpt2p::testing {

inline model::GPT2Config small_model(int64_t blocks, int64_t vocab, int64_t width = -1,
                                     int64_t heads = -1, int64_t context = -1) {
  auto c = model::preset("tiny");
  c.n_layer = blocks;
  c.dropout = 0.0;
  c.vocab_size = vocab;
  if (width > 0) c.n_embd = width;
  if (heads > 0) c.n_head = heads;
  if (context > 0) c.n_ctx = context;
  return c;
}

}  // namespace gpt2p::testing
