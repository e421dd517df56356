// A contiguous run of a GPT-2's stage layers: what one pipeline stage holds, and what a model is
// built for (model/gpt2.h). Torch-free. The layers:
//   0        token + position embedding (wte, wpe)
//   1..L     transformer block b-1 (h.0 .. h.{L-1})
//   L+1      final layer norm (ln_f) + LM head (tied to wte)
#pragma once

namespace gpt2p::pipeline {

// Half-open [begin, end) of stage layers.
struct LayerRange {
  int begin = 0;  // first layer
  int end = 0;    // one past the last layer
  int size() const { return end - begin; }
  bool contains(int layer) const { return layer >= begin && layer < end; }
  bool operator==(const LayerRange& o) const { return begin == o.begin && end == o.end; }
};

}  // namespace gpt2p::pipeline
