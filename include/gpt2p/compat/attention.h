// Causal self-attention on every libtorch the project builds against (compat/version.h).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>

#include "gpt2p/compat/attention_choice.h"
#include "gpt2p/compat/version.h"

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

// --attention: which kernels torch's scaled_dot_product_attention may pick from on libtorch >= 2.0:
// kAuto (all of them, torch's order), or only flash, cudnn (2.4 and later), efficient or math. On
// 1.13 the explicit computation is the only one: auto and math are accepted, the others throw.
void set_attention_backend(Attention choice);

// The kernel causal_attention runs for [batch, heads, seq, head_dim] inputs of `dtype` on
// `device` under the current choice: "flash", "cudnn", "efficient", "math", or "explicit"
// (libtorch 1.13). Asks torch's own dispatcher (at::_fused_sdp_choice) with one sequence.
std::string attention_backend(const torch::Device& device, torch::ScalarType dtype, int64_t heads,
                              int64_t seq, int64_t head_dim, double dropout);

}  // namespace gpt2p::compat
