#include "gpt2p/model/block.h"

#include "gpt2p/compat/attention.h"
#include "gpt2p/compat/device.h"
#include "gpt2p/core/error.h"
#if GPT2P_WITH_CUDA
#include "gpt2p/kernels/fused_linear.h"
#include "gpt2p/kernels/fused_mlp.h"
#include "gpt2p/kernels/fused_norm.h"
#endif

namespace gpt2p::model {

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const GPT2Config& config)
    : n_head_(config.n_head), dropout_(config.dropout) {
  c_attn = register_module("c_attn", torch::nn::Linear(config.n_embd, 3 * config.n_embd));
  c_proj = register_module("c_proj", torch::nn::Linear(config.n_embd, config.n_embd));
  resid_dropout_ = register_module("resid_dropout", torch::nn::Dropout(config.dropout));
}

namespace {
// A linear layer, its weight gradient deferred when there is a store. Not layer->forward(x): the
// C++ frontend's functional linear runs a [B,T,C] input as matmul, then adds the bias in a
// separate pass over the output. ATen's linear folds it into one GEMM with the bias in its
// epilogue, as PyTorch's Python does. On one H200 the separate pass cost 5.5 ms of a 17.4 ms
// forward at 16 x 1024 tokens in bf16 (results/2026-12-01-h200-zero-bubble-memory/).
// With Kernels::kFused on a GPU under bf16 autocast, kernels::linear: the same forward, and the
// weight and bias gradients from one GEMM in backward (`accumulate`: the weight's added into its
// .grad by that GEMM, GPT2Impl::set_grad_accumulation).
torch::Tensor apply_linear(torch::nn::Linear& layer, const torch::Tensor& x,
                           const std::shared_ptr<WeightGradStore>& store, Kernels path,
                           bool accumulate) {
  if (store) return deferred_linear(x, layer->weight, layer->bias, store);
#if GPT2P_WITH_CUDA
  if (path == Kernels::kFused && x.is_cuda() && compat::autocast_enabled(x.device())) {
    return kernels::linear(x, layer->weight, layer->bias, accumulate);
  }
#else
  (void)path;
  (void)accumulate;
#endif
  return torch::linear(x, layer->weight, layer->bias);
}
}  // namespace

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  const int64_t b = x.size(0), t = x.size(1), c = x.size(2);
  auto qkv = apply_linear(c_attn, x, weight_grads, kernels, accumulate_grads).split(c, /*dim=*/2);
  auto heads = [&](const torch::Tensor& y) {
    return y.view({b, t, n_head_, c / n_head_}).transpose(1, 2);  // [B,H,T,D]
  };
  auto y = compat::causal_attention(heads(qkv[0]), heads(qkv[1]), heads(qkv[2]), dropout_,
                                    is_training());
  y = y.transpose(1, 2).contiguous().view({b, t, c});
  return resid_dropout_(apply_linear(c_proj, y, weight_grads, kernels, accumulate_grads));
}

MLPImpl::MLPImpl(const GPT2Config& config) {
  c_fc = register_module("c_fc", torch::nn::Linear(config.n_embd, 4 * config.n_embd));
  c_proj = register_module("c_proj", torch::nn::Linear(4 * config.n_embd, config.n_embd));
  dropout_ = register_module("dropout", torch::nn::Dropout(config.dropout));
}

torch::Tensor MLPImpl::forward(const torch::Tensor& x) {
#if GPT2P_WITH_CUDA
  // The GELU inside c_fc's and c_proj's GEMMs (kernels/fused_mlp.h); not where zero-bubble defers
  // the weight gradients.
  if (kernels == Kernels::kFused && !weight_grads && x.is_cuda() &&
      compat::autocast_enabled(x.device()) && kernels::gelu_epilogue_enabled()) {
    return dropout_(
        kernels::mlp(x, c_fc->weight, c_fc->bias, c_proj->weight, c_proj->bias, accumulate_grads));
  }
#endif
  return dropout_(apply_linear(
      c_proj, torch::gelu(apply_linear(c_fc, x, weight_grads, kernels, accumulate_grads), "tanh"),
      weight_grads, kernels, accumulate_grads));
}

BlockImpl::BlockImpl(const GPT2Config& config) {
  const auto ln = torch::nn::LayerNormOptions({config.n_embd}).eps(config.layer_norm_eps);
  ln_1 = register_module("ln_1", torch::nn::LayerNorm(ln));
  attn = register_module("attn", CausalSelfAttention(config));
  ln_2 = register_module("ln_2", torch::nn::LayerNorm(ln));
  mlp = register_module("mlp", MLP(config));
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x) {
  auto y = x + attn(ln_1(x));
  return y + mlp(ln_2(y));
}

#if GPT2P_WITH_CUDA
namespace {
std::vector<torch::Tensor> add_norm(const torch::Tensor& residual, const torch::Tensor& delta,
                                    const torch::nn::LayerNorm& ln, torch::ScalarType out_type,
                                    bool accumulate) {
  return kernels::add_layer_norm(residual, delta, ln->weight, ln->bias, ln->options.eps(), out_type,
                                 accumulate);
}
}  // namespace

std::pair<torch::Tensor, torch::Tensor> BlockImpl::forward_fused(const torch::Tensor& residual,
                                                                 const torch::Tensor& delta,
                                                                 torch::ScalarType out_type) {
  const auto first = add_norm(residual, delta, ln_1, out_type, accumulate_grads);  // {x, ln_1(x)}
  const auto second =
      add_norm(first[0], attn(first[1]), ln_2, out_type, accumulate_grads);  // {y, ln_2(y)}
  return {second[0], mlp(second[1])};
}
#else
std::pair<torch::Tensor, torch::Tensor> BlockImpl::forward_fused(const torch::Tensor&,
                                                                 const torch::Tensor&,
                                                                 torch::ScalarType) {
  GPT2P_FAIL("the fused LayerNorm kernels are not in this build (its Torch has no CUDA)",
             "pass --kernels reference");
  return {};
}
#endif

}  // namespace gpt2p::model
