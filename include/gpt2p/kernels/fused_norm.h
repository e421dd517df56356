// The torch-facing side of kernels/layer_norm.h: residual add + LayerNorm on CUDA tensors, as
// two plain calls and as one differentiable op (built only when Torch has CUDA; the CPU build and
// CPU tensors keep torch::layer_norm).
#pragma once

#include <torch/torch.h>

#include <tuple>
#include <vector>

namespace gpt2p::kernels {

// y: x + delta (float32, x's shape), or x itself when delta is undefined. out: LayerNorm(y) in
// out_type, x's shape. mean, rstd: float32 [rows], rows = x.numel() / C.
struct NormResult {
  torch::Tensor y, out, mean, rstd;
};

// x [..., C] float32; delta undefined or x's shape in float32 or bfloat16; gamma, beta [C]
// float32; out_type bfloat16 or float32. All CUDA, contiguous, on one device; C <= 8192.
NormResult add_layer_norm_forward(const torch::Tensor& x, const torch::Tensor& delta,
                                  const torch::Tensor& gamma, const torch::Tensor& beta, double eps,
                                  torch::ScalarType out_type);

// The gradients of add_layer_norm_forward's out: dout [..., C] (bfloat16 or float32), y, mean
// and rstd as it returned them, gamma; dresidual undefined or float32 of y's shape (the gradient
// arriving at y itself, added to dy). Returns (dy float32 of y's shape, dgamma [C], dbeta [C]),
// dgamma and dbeta summed in a fixed order (deterministic). Given `into_dgamma` and `into_dbeta`
// (float32 [C], contiguous, on y's device) the sums are added into them instead, and the
// returned dgamma and dbeta are undefined.
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> add_layer_norm_backward(
    const torch::Tensor& dout, const torch::Tensor& y, const torch::Tensor& mean,
    const torch::Tensor& rstd, const torch::Tensor& gamma, const torch::Tensor& dresidual,
    const torch::Tensor& into_dgamma = {}, const torch::Tensor& into_dbeta = {});

// y = x + delta (delta may be undefined: y = x), out = LayerNorm(y) in out_type; returns {y, out};
// differentiable in x, delta, gamma, beta. With `accumulate_grad`, where gamma's and beta's .grad
// exist (float32, contiguous: a graphed pipeline stage keeps them), backward adds their gradients
// into them in its reduction kernel and hands autograd none, as kernels::linear does with its
// weight: one kernel less per parameter and micro-batch.
std::vector<torch::Tensor> add_layer_norm(const torch::Tensor& x, const torch::Tensor& delta,
                                          const torch::Tensor& gamma, const torch::Tensor& beta,
                                          double eps, torch::ScalarType out_type,
                                          bool accumulate_grad = false);

}  // namespace gpt2p::kernels
