// Residual add + LayerNorm over rows of width cols, forward and backward (CUDA).
//
// Forward, for each row of x [rows, cols] (float32) and optional delta (float32 or bfloat16):
//   y    = x + delta                       (written to y, float32; y = x when there is no delta)
//   mean = sum(y) / cols,  var = sum((y - mean)^2) / cols   (biased, two passes over the row)
//   rstd = rsqrt(var + eps)
//   out  = (y - mean) * rstd * gamma + beta                 (bfloat16 or float32)
// as torch's layer_norm computes it: float32 arithmetic whatever the storage types.
//
// Backward, for each row, with xhat = (y - mean) * rstd and g = dout * gamma:
//   dy = rstd * (g - mean(g) - xhat * mean(g * xhat)) + dresidual   (dresidual optional)
//   dgamma = sum over rows of dout * xhat,  dbeta = sum over rows of dout
// The parameter gradients are deterministic: each block of the first kernel sums a fixed range
// of rows into its own slice of the workspace, and a second kernel adds the slices in a fixed
// order, so the result does not depend on scheduling or on the GPU.
//
// cols <= 8192. Rows whose width is a multiple of 4 and whose pointers are 16-byte aligned
// (8-byte for bfloat16) move as 16-byte vectors; any other width takes a scalar path.
//
// This header is free of torch and CUDA types so that the kernels build with nvcc alone;
// kernels/fused_norm.h is the torch-facing side.
#pragma once

#include <cstdint>

#include "gpt2p/kernels/cross_entropy.h"  // ElementType

namespace gpt2p::kernels {

inline constexpr int64_t kLayerNormMaxCols = 8192;

struct AddLayerNormForward {
  const float* x = nullptr;     // [rows, cols]
  const void* delta = nullptr;  // [rows, cols] of delta_type, or null: no residual add
  ElementType delta_type = ElementType::kBFloat16;
  const float* gamma = nullptr;  // [cols]
  const float* beta = nullptr;   // [cols]
  float* y = nullptr;            // [rows, cols]: x + delta; required with delta (may be x itself),
                                 // ignored without it
  void* out = nullptr;           // [rows, cols] of out_type
  ElementType out_type = ElementType::kBFloat16;
  float* mean = nullptr;  // [rows]
  float* rstd = nullptr;  // [rows]
  int64_t rows = 0, cols = 0;
  float eps = 1e-5f;
};

struct AddLayerNormBackward {
  const void* dout = nullptr;  // [rows, cols] of dout_type: the gradient arriving at out
  ElementType dout_type = ElementType::kBFloat16;
  const float* y = nullptr;          // [rows, cols]: the forward's normalised input
  const float* mean = nullptr;       // [rows], as the forward wrote them
  const float* rstd = nullptr;       // [rows]
  const float* gamma = nullptr;      // [cols]
  const float* dresidual = nullptr;  // [rows, cols]: the gradient arriving at y, or null
  float* dy = nullptr;               // [rows, cols]: d loss / d y (may be dresidual itself)
  float* dgamma = nullptr;           // [cols], overwritten (added into with accumulate)
  float* dbeta = nullptr;            // [cols], overwritten (added into with accumulate)
  float* workspace = nullptr;        // add_layer_norm_workspace(rows, cols) floats, 16-byte aligned
  int64_t rows = 0, cols = 0;
  bool accumulate = false;  // dgamma += and dbeta += this backward's sums
};

// Floats of workspace add_layer_norm_backward needs for rows x cols: two slices of cols for each
// block of rows. Depends only on the shape.
int64_t add_layer_norm_workspace(int64_t rows, int64_t cols);

// Both launch on `stream` (a cudaStream_t) and fail with a message on bad sizes or a launch error.
void add_layer_norm_forward(const AddLayerNormForward& args, void* stream);
void add_layer_norm_backward(const AddLayerNormBackward& args, void* stream);

}  // namespace gpt2p::kernels
