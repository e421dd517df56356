// Softmax cross-entropy and its gradient in one pass over a chunk of logits (CUDA).
//
// For each row i of logits [rows, padded] (row stride ld), with label y_i and weight w_i:
//   loss_i = w_i * (logsumexp(x_i[:vocab]) - x_i[y_i])
// and, when grad is set, the row is overwritten with d loss_i / d x_i:
//   w_i * (softmax(x_i[:vocab]) - onehot(y_i))   in columns < vocab,   0 in the padded ones.
// Softmax and logsumexp are computed in float32 whatever the logits' type. A row of weight 0
// gets loss 0 and a zero gradient without being read. A label outside [0, vocab) gives a NaN
// loss (the trainers stop on a non-finite loss) rather than reading past the row.
//
// This header is free of torch and CUDA types so that the kernels build with nvcc alone;
// kernels/fused_head.h is the torch-facing side.
#pragma once

#include <cstdint>

namespace gpt2p::kernels {

enum class ElementType { kFloat32, kBFloat16 };

struct CrossEntropyChunk {
  void* logits = nullptr;  // [rows, ld] of ElementType, row-major; overwritten when grad
  ElementType type = ElementType::kBFloat16;
  int64_t rows = 0, ld = 0;
  int64_t vocab = 0, padded = 0;    // columns that count, and columns in all (padded <= ld)
  const int64_t* labels = nullptr;  // [rows], device
  const float* weights = nullptr;   // [rows], device
  float* losses = nullptr;          // [rows], device: the weighted loss of each row
  bool grad = true;
};

// Launches on `stream` (a cudaStream_t). Fails with a CUDA error message on a launch error.
void softmax_cross_entropy(const CrossEntropyChunk& chunk, void* stream);

}  // namespace gpt2p::kernels
