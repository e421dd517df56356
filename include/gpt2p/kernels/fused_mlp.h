// GPT-2's MLP (c_fc, tanh-GELU, c_proj) with the GELU inside the GEMMs (CUDA builds only; the
// CPU build and CPU tensors use torch::linear and torch::gelu).
//
// Forward, c_fc's GEMM adds the bias and applies GELU in its epilogue
// (CUBLASLT_EPILOGUE_GELU_AUX_BIAS), writing the activation and, beside it, GELU's input for
// backward. Backward, the GEMM that carries the gradient back through c_proj multiplies it by
// GELU's derivative in its epilogue (CUBLASLT_EPILOGUE_DGELU). Each saves one elementwise pass
// over the [tokens, 4 * n_embd] activation that the plain path (torch::gelu and its backward)
// runs. The weight and bias gradients come from one GEMM each, as kernels::linear's. cuBLASLt's
// GELU is the tanh approximation, as GPT-2's.
#pragma once

#include <torch/torch.h>

namespace gpt2p::kernels {

// pre = x w^T + b and h = gelu_tanh(pre) in one GEMM: x [n, in], w [hidden, in], b [hidden], all
// contiguous CUDA tensors of one type. False (nothing written) where cuBLASLt has no algorithm.
bool linear_gelu(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                 torch::Tensor& pre, torch::Tensor& h);

// dpre = (dy w) * gelu_tanh'(pre) in one GEMM: dy [n, out], w [out, hidden], pre [n, hidden], as
// linear_gelu's.
bool matmul_dgelu(const torch::Tensor& dy, const torch::Tensor& w, const torch::Tensor& pre,
                  torch::Tensor& dpre);

// c_proj(gelu_tanh(c_fc(x))): x [..., in], w_fc [hidden, in], b_fc [hidden], w_proj [out, hidden],
// b_proj [out]; computed in autocast's type (as kernels::linear), differentiable in every
// argument. Where cuBLASLt has no algorithm for an epilogue, that part runs the plain way.
// `accumulate_grad`: both weights' gradients go into their .grad in the GEMMs where it exists
// (fused_linear.h: weight_and_bias_grads with accumulate_into).
torch::Tensor mlp(const torch::Tensor& x, const torch::Tensor& w_fc, const torch::Tensor& b_fc,
                  const torch::Tensor& w_proj, const torch::Tensor& b_proj,
                  bool accumulate_grad = false);

// Whether the model runs its MLPs through kernels::mlp where the fused kernels run (the fused
// linear layers and torch::gelu otherwise): on unless GPT2P_GELU_EPILOGUE=0 in the environment
// (read once) or set_gelu_epilogue(false). Measured beside the plain path by
// scripts/matrices/step-fusion.tsv (faster, same losses).
bool gelu_epilogue_enabled();
void set_gelu_epilogue(bool on);

}  // namespace gpt2p::kernels
