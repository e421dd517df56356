// Every difference between the libtorch versions we build against (Debian's 1.13 CPU build and
// PyTorch 2.x with CUDA) lives here, and only here.
#pragma once

#include <torch/torch.h>
#include <torch/version.h>

#define GPT2P_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||        \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace gpt2p::compat {

// torch::scaled_dot_product_attention exists from 2.0 on.
inline constexpr bool kHasFusedAttention = GPT2P_TORCH_AT_LEAST(2, 0);

// Causal scaled-dot-product attention, q/k/v of shape [B, H, T, D]. On libtorch >= 2.0 the fused
// kernel; on 1.13 an explicit masked softmax. dropout_p applies to attention weights.
torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, double dropout_p, bool training);

// The same computation always done explicitly, so tests can compare the two paths.
torch::Tensor causal_attention_reference(const torch::Tensor& q, const torch::Tensor& k,
                                         const torch::Tensor& v);

// "major.minor.patch" of the torch we were compiled against.
const char* torch_version();

}  // namespace gpt2p::compat
