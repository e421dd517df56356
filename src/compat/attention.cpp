#include "gpt2p/compat/attention.h"

#include <cmath>
#include <limits>

#include "gpt2p/core/error.h"

namespace gpt2p::compat {

torch::Tensor causal_attention_reference(const torch::Tensor& q, const torch::Tensor& k,
                                         const torch::Tensor& v) {
  const int64_t t_q = q.size(-2);
  const int64_t t_k = k.size(-2);
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  auto att = torch::matmul(q, k.transpose(-2, -1)) * scale;
  const auto mask =
      torch::ones({t_q, t_k}, torch::TensorOptions().dtype(torch::kBool).device(q.device()))
          .triu(1);
  att = att.masked_fill(mask, -std::numeric_limits<float>::infinity());
  att = torch::softmax(att, -1);
  return torch::matmul(att, v);
}

torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, double dropout_p, bool training) {
  const double p = training ? dropout_p : 0.0;
#if GPT2P_TORCH_AT_LEAST(2, 0)
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, p, /*is_causal=*/true);
#else
  if (p == 0.0) return causal_attention_reference(q, k, v);
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  auto att = torch::matmul(q, k.transpose(-2, -1)) * scale;
  const auto mask = torch::ones({q.size(-2), k.size(-2)},
                                torch::TensorOptions().dtype(torch::kBool).device(q.device()))
                        .triu(1);
  att = torch::softmax(att.masked_fill(mask, -std::numeric_limits<float>::infinity()), -1);
  att = torch::dropout(att, p, /*train=*/true);
  return torch::matmul(att, v);
#endif
}

void set_attention_backend(Attention choice) {
#if GPT2P_TORCH_AT_LEAST(2, 0)
  auto& ctx = at::globalContext();
  const bool all = choice == Attention::kAuto;
  ctx.setSDPUseFlash(all || choice == Attention::kFlash);
  ctx.setSDPUseMemEfficient(all || choice == Attention::kEfficient);
  ctx.setSDPUseMath(all || choice == Attention::kMath);
#if GPT2P_TORCH_AT_LEAST(2, 4)
  ctx.setSDPUseCuDNN(all || choice == Attention::kCudnn);
#else
  GPT2P_CHECK(choice != Attention::kCudnn,
              "--attention cudnn: libtorch " << TORCH_VERSION << " has no cuDNN attention",
              "pass --attention auto, flash, efficient or math, or use libtorch 2.4 or later");
#endif
#else
  GPT2P_CHECK(choice == Attention::kAuto || choice == Attention::kMath,
              "--attention " << name_of(choice) << ": libtorch " << TORCH_VERSION
                             << " computes attention explicitly (no fused kernels)",
              "pass --attention auto, or build against libtorch 2.0 or later");
#endif
}

std::string attention_backend(const torch::Device& device, torch::ScalarType dtype, int64_t heads,
                              int64_t seq, int64_t head_dim, double dropout) {
#if GPT2P_TORCH_AT_LEAST(2, 0)
  const auto q =
      torch::empty({1, heads, seq, head_dim}, torch::TensorOptions().dtype(dtype).device(device));
  const int64_t choice =
      at::_fused_sdp_choice(q, q, q, /*attn_mask=*/{}, dropout, /*is_causal=*/true);
  switch (choice) {  // sdp::SDPBackend (ATen/native/transformers/sdp_utils_cpp.h)
    case 0: return "math";
    case 1: return "flash";
    case 2: return "efficient";
    case 3: return "cudnn";
    default: return "backend " + std::to_string(choice);
  }
#else
  (void)device, (void)dtype, (void)heads, (void)seq, (void)head_dim, (void)dropout;
  return "explicit";
#endif
}

}  // namespace gpt2p::compat
