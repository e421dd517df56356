// The torch-facing side of the project's CUDA kernels (built only when Torch has CUDA; the CPU
// build and CPU tensors take the reference path in model/lm_head_loss.cpp).
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace gpt2p::kernels {

// kernels/cross_entropy.h on a chunk of logits [rows, padded] (CUDA, bfloat16 or float32, rows
// contiguous). Returns the rows' weighted losses (float32 [rows]); with grad, logits now hold the
// weighted gradient d loss / d logits.
torch::Tensor softmax_cross_entropy_(const torch::Tensor& logits, const torch::Tensor& labels,
                                     const torch::Tensor& weights, int64_t vocab, bool grad);

// out += a^T b with a [k, m] and b [k, n] (both bfloat16 or both float32, contiguous, CUDA) and
// out [m, n] float32: one cuBLAS GEMM accumulating in float32 straight into out, so a sum over
// chunks is never rounded to bfloat16. Float32 inputs use TF32 only where torch allows it. With
// `add` false, out = a^T b (what out held is never read, so it needs no zeroing).
void add_matmul_tn(const torch::Tensor& out, const torch::Tensor& a, const torch::Tensor& b,
                   bool add = true);

}  // namespace gpt2p::kernels
