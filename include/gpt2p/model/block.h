// GPT-2's transformer block and its two halves, as modules: causal self-attention and the MLP,
// each with its residual dropout, and the pre-LayerNorm block around them (gpt2.h stacks them).
// Parameter names follow Hugging Face's GPT2Block (ln_1, attn.c_attn, attn.c_proj, ln_2,
// mlp.c_fc, mlp.c_proj).
#pragma once

#include <torch/torch.h>

#include <memory>
#include <utility>

#include "gpt2p/model/config.h"
#include "gpt2p/model/deferred_linear.h"
#include "gpt2p/model/options.h"

namespace gpt2p::model {

class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  explicit CausalSelfAttentionImpl(const GPT2Config& config);
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Linear c_attn{nullptr}, c_proj{nullptr};
  std::shared_ptr<WeightGradStore> weight_grads;  // set: the linears defer their weight gradients
  Kernels kernels = Kernels::kReference;          // kFused: kernels::linear under bf16 autocast
  bool accumulate_grads = false;  // kFused: weight gradients added into .grad in the GEMM

 private:
  int64_t n_head_;
  double dropout_;
  torch::nn::Dropout resid_dropout_{nullptr};
};
TORCH_MODULE(CausalSelfAttention);

class MLPImpl : public torch::nn::Module {
 public:
  explicit MLPImpl(const GPT2Config& config);
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Linear c_fc{nullptr}, c_proj{nullptr};
  std::shared_ptr<WeightGradStore> weight_grads;  // set: the linears defer their weight gradients
  // kFused: kernels::linear under autocast, and torch::gelu between them; kernels::mlp (the GELU
  // in the GEMMs' epilogues) instead where kernels::gelu_epilogue_enabled() and weight_grads is
  // not set.
  Kernels kernels = Kernels::kReference;
  bool accumulate_grads = false;  // kFused: weight gradients added into .grad in the GEMMs

 private:
  torch::nn::Dropout dropout_{nullptr};
};
TORCH_MODULE(MLP);

// Pre-LayerNorm transformer block: x + attn(ln_1(x)), then + mlp(ln_2(.)).
class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const GPT2Config& config);
  torch::Tensor forward(const torch::Tensor& x);

  // The same block with every residual add inside a LayerNorm kernel (kernels/fused_norm.h;
  // CUDA): the block's input is residual + delta (delta undefined: residual alone), and it
  // returns the next (residual, delta) pair, whose sum is forward()'s output. The LayerNorms'
  // outputs are out_type (bf16 under autocast, what the linear layers take).
  std::pair<torch::Tensor, torch::Tensor> forward_fused(const torch::Tensor& residual,
                                                        const torch::Tensor& delta,
                                                        torch::ScalarType out_type);

  torch::nn::LayerNorm ln_1{nullptr}, ln_2{nullptr};
  CausalSelfAttention attn{nullptr};
  MLP mlp{nullptr};
  // forward_fused: the LayerNorms' gradients added into their .grad (kernels::add_layer_norm)
  bool accumulate_grads = false;
};
TORCH_MODULE(Block);

}  // namespace gpt2p::model
