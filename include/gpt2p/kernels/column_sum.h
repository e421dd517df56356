// Column sums of a row-major matrix, written or added into a float32 vector (CUDA): a linear
// layer's bias gradient, the sum over rows of its output gradient, added into the bias's .grad.
//
// cuBLASLt's BGRADB epilogue reduces those rows in a kernel of its own after the weight-gradient
// GEMM and writes a new vector, which autograd then adds into .grad in another kernel: two per
// layer and micro-batch. Where .grad stays allocated across micro-batches (a graphed pipeline
// stage), this sums the rows straight into it.
//
// Deterministic: each block of the first kernel sums a fixed range of rows of a fixed range of
// columns, in a fixed order, into its own slice of the workspace; a second kernel adds the slices
// in a fixed order. Rows whose width is a multiple of the vector width (8 bfloat16, 4 float32)
// and whose pointer is 16-byte aligned move as 16-byte vectors; any other shape takes a scalar
// path.
//
// Free of torch and CUDA types, as layer_norm.h; kernels/fused_linear.h is the torch-facing side.
#pragma once

#include <cstdint>

#include "gpt2p/kernels/cross_entropy.h"  // ElementType

namespace gpt2p::kernels {

struct ColumnSums {
  const void* x = nullptr;  // [rows, cols] of type, row-major
  ElementType type = ElementType::kBFloat16;
  float* out = nullptr;        // [cols]: overwritten, or added into with accumulate
  float* workspace = nullptr;  // column_sums_workspace(rows, cols) floats, 16-byte aligned
  int64_t rows = 0, cols = 0;
  bool accumulate = true;  // out += the sums
};

// Floats of workspace column_sums needs for rows x cols. Depends only on the shape.
int64_t column_sums_workspace(int64_t rows, int64_t cols);

// Launches on `stream` (a cudaStream_t); fails with a message on bad sizes or a launch error.
// No rows: out is zeroed (or left as it is with accumulate).
void column_sums(const ColumnSums& args, void* stream);

}  // namespace gpt2p::kernels
