// A linear layer whose backward computes the weight and bias gradients in one cuBLASLt GEMM
// (CUDA builds only; the CPU build and CPU tensors use torch::linear).
//
// Under bf16 autocast, ATen's linear backward runs the weight-gradient GEMM in bf16, casts the
// result to the float32 weight's type in a separate pass, and reduces the bias gradient in a
// third (a bf16 reduction over every row of the output gradient). Here one GEMM writes the
// weight gradient in float32 straight from its float32 accumulators, and its epilogue
// (CUBLASLT_EPILOGUE_BGRADB) sums the output gradient's rows into the float32 bias gradient on
// the way. GPT-2 124M at 16 x 1024 tokens has 48 such layers per step.
#pragma once

#include <torch/torch.h>

namespace gpt2p::kernels {

// dw = dy^T x and db = the column sums of dy, for dy [n, out] and x [n, in] (both bfloat16 or both
// float32, contiguous, CUDA): returns {dw [out, in], db [out]} in float32. Returns false when
// cuBLASLt has no algorithm for the shapes (the caller then computes them the plain way).
bool linear_weight_grads(const torch::Tensor& dy, const torch::Tensor& x, torch::Tensor& dw,
                         torch::Tensor& db);

// The same gradients, from linear_weight_grads where cuBLASLt has an algorithm and from ATen's
// matmul and sum otherwise: what a fused layer's backward calls.
void weight_and_bias_grads(const torch::Tensor& dy, const torch::Tensor& x, torch::Tensor& dw,
                           torch::Tensor& db);

// dw = dy^T x added into `grad` (float32 [out, in], contiguous, CUDA) by the GEMM itself (beta =
// 1: no gradient tensor of its own and no separate add), db as linear_weight_grads returns it.
// False, with grad unchanged, where cuBLASLt has no algorithm for it.
bool add_linear_weight_grads(const torch::Tensor& dy, const torch::Tensor& x, torch::Tensor& grad,
                             torch::Tensor& db);

// A fused layer's weight and bias gradients where the weight's gradient may be accumulated in
// place: when `accumulate_into` (the layer's weight) is defined and its .grad exists as float32 of
// its shape, the weight gradient is added into that .grad by the GEMM and `dw` is left undefined
// (the layer's backward returns none for the weight, and autograd adds nothing); otherwise as
// weight_and_bias_grads. For a step of several micro-batches whose .grad stays allocated (a CUDA
// graph's, zeroed in place between steps) this spares one read and write of every weight
// gradient per micro-batch. Not where a hook must see each micro-batch's weight gradient.
void weight_and_bias_grads(const torch::Tensor& dy, const torch::Tensor& x,
                           const torch::Tensor& accumulate_into, torch::Tensor& dw,
                           torch::Tensor& db);

// x W^T + b, like torch::linear, in bfloat16 when autocast is on for x's device (as autocast's
// linear) and in the weight's type otherwise; differentiable in x, weight and bias, with the
// weight and bias gradients from linear_weight_grads. x [..., in], weight [out, in], bias [out].
// `accumulate_grad`: the weight gradient goes into weight's .grad in the GEMM where it exists
// (weight_and_bias_grads with accumulate_into).
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                     bool accumulate_grad = false);

}  // namespace gpt2p::kernels
