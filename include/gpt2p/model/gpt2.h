// GPT-2 in the libtorch idiom, with parameter names that map 1:1 to Hugging Face's
// GPT2LMHeadModel (minus its "transformer." prefix; HF's Conv1D weights are stored transposed).
//
// For pipeline parallelism the model is a list of layers:
//   layer 0            = embedding: wte + wpe + dropout          ids [B,T] int64 -> hidden [B,T,C]
//   layers 1..n_layer  = transformer blocks h.0 .. h.<n_layer-1>  hidden -> hidden
//   layer n_layer + 1  = final LayerNorm ln_f + LM head (tied to wte)  hidden -> logits [B,T,Vp]
// A GPT2 built for a LayerRange [begin, end) registers only what that range needs, under the same
// names as in the full model (block i is always "h.<i>"). A range with the head but without the
// embedding registers its own "wte" (the tied head weight); keeping it equal to the embedding's
// copy on another stage is the trainer's job (sum their gradients).
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>

#include "gpt2p/model/block.h"
#include "gpt2p/model/config.h"
#include "gpt2p/model/deferred_linear.h"
#include "gpt2p/model/lm_head_loss.h"
#include "gpt2p/model/options.h"
#include "gpt2p/pipeline/plan/layer_range.h"

namespace gpt2p::model {

using pipeline::LayerRange;

// The type `precision` autocasts to (compat::AutocastGuard): torch::kBFloat16 for bf16,
// torch::kHalf for fp16, torch::kFloat32 (no autocast) for fp32 and tf32.
torch::ScalarType autocast_type(Precision precision);

class GPT2Impl : public torch::nn::Module {
 public:
  // The whole model, or the stage layers `range` (layer_range.h). Validates config and range;
  // parameters are initialised with reset_parameters(0).
  explicit GPT2Impl(const GPT2Config& config);
  GPT2Impl(const GPT2Config& config, LayerRange range);

  // Runs the range: token ids [B,T] (int64) if it starts at the embedding, else hidden [B,T,C];
  // returns logits [B,T,padded_vocab_size] if it ends with the head, else hidden [B,T,C].
  torch::Tensor forward(const torch::Tensor& x);

  // forward() without the head's projection: with the head, the final LayerNorm's output.
  torch::Tensor features(const torch::Tensor& x);

  // Stages with the head: the loss of `rows` (see lm_head_loss.h) from the range's input, with the
  // head computed only at those positions, in `autocast` (autocast_type: bf16 or fp16) or, for
  // kFloat32, in the weight's dtype.
  torch::Tensor loss(const torch::Tensor& x, const LossRows& rows, torch::ScalarType autocast,
                     int64_t chunk_rows = kLossChunkRows);

  // How the model runs the operations that have CUDA kernels (kernels.h): the head's softmax
  // and cross-entropy in loss(), the blocks' linear layers under bf16 autocast (their weight and
  // bias gradients in one GEMM, kernels/fused_linear.h). kReference until set.
  void set_kernels(Kernels kernels);
  Kernels kernels() const { return kernels_; }

  // Gradients added into .grad where it exists instead of handed to autograd to add: with the
  // fused kernels the blocks' linear layers add their weight gradients inside the weight-gradient
  // GEMM (beta = 1; kernels/fused_linear.h: weight_and_bias_grads) and the fused LayerNorms their
  // gamma and beta gradients in their reduction kernel (kernels/fused_norm.h); with either
  // kernels the head adds wte's gradient in one pass (lm_head_loss.h). For a pipeline stage
  // running several micro-batches a step with .grad kept allocated (its CUDA graphs); not where
  // a hook must see each backward's weight gradients. Off until set. GPT2P_GEMM_ACCUMULATE=0 in
  // the environment keeps it off (autograd adds each gradient), to compare.
  void set_grad_accumulation(bool on);

  // Which activations backward recomputes (options.h). kBlocks: a training forward that autograd
  // records keeps only each block's inputs, and backward runs the block again (recompute.h), on
  // either path of the blocks. Eval and no-grad forwards run the blocks plainly. kNone until set.
  void set_recompute(Recompute recompute) { recompute_ = recompute; }
  Recompute recompute() const { return recompute_; }

  // GPT-2 init (normal 0.02; residual projections 0.02/sqrt(2*n_layer); zero biases; LayerNorm
  // 1/0; padded wte rows zero), each layer from its own generator seeded by (seed, layer index),
  // so a stage holds exactly the weights of the same layers of a full model with that seed.
  void reset_parameters(uint64_t seed);

  // The tied embedding / head weight [padded_vocab, C], or an undefined tensor if not held.
  torch::Tensor tied_parameter() const;

  // Takes the embedding's part of the tied weight's gradient out of autograd (data parallelism's
  // sparse sync, grad_sync.h; a pipeline stage's once-per-step sum,
  // GptStage::sum_lookup_grads_per_step). With a sink set, the token lookup contributes no gradient
  // to wte through autograd, so wte's gradient is complete as soon as the head's is; instead
  // backward hands the sink the lookup's ids [B,T] and output gradient [B,T,C], and whoever set it
  // must add the embedding's part to wte's gradient itself. An empty function restores the plain
  // lookup.
  using EmbeddingGradSink =
      std::function<void(const torch::Tensor& ids, const torch::Tensor& grad)>;
  void set_embedding_grad_sink(EmbeddingGradSink sink);
  bool has_embedding_grad_sink() const { return sink_ != nullptr; }

  // Zero-bubble pipelines (deferred_linear.h): with a store, the blocks' four linear layers leave
  // their weight gradients in it instead of computing them in backward; null restores the plain
  // layers. Embedding, LayerNorms and the head keep computing theirs in backward.
  void set_weight_grad_store(std::shared_ptr<WeightGradStore> store);

  // lm_loss / lm_loss_all below, with this model's vocab_size.
  torch::Tensor lm_loss(const torch::Tensor& logits, const torch::Tensor& labels,
                        const torch::Tensor& mask) const;
  torch::Tensor lm_loss_all(const torch::Tensor& logits, const torch::Tensor& ids) const;

  const GPT2Config& config() const { return config_; }
  const LayerRange& range() const { return range_; }
  bool has_embedding() const { return range_.begin == 0; }
  bool has_head() const { return range_.end == config_.num_stage_layers(); }
  bool is_full() const { return has_embedding() && has_head(); }

  // Submodules (null when outside the range). Blocks are keyed by their global index.
  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::ModuleDict h{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};

 private:
  GPT2Config config_;
  LayerRange range_;
  Kernels kernels_ = Kernels::kReference;
  Recompute recompute_ = Recompute::kNone;
  bool accumulate_grads_ = false;  // set_grad_accumulation
  torch::nn::Dropout drop_{nullptr};
  // With a sink: the lookup's only autograd input (no parameter; wte is read detached).
  std::shared_ptr<EmbeddingGradSink> sink_;
  torch::Tensor sink_anchor_;
};
TORCH_MODULE(GPT2);

// Mean cross-entropy over the positions where mask == 1, using only the first vocab_size logit
// columns (padded columns never count). logits [B,T,V'>=vocab_size], labels [B,T] int64 (any
// value where mask == 0), mask [B,T] (float or bool). Computed in float32.
torch::Tensor lm_loss(const torch::Tensor& logits, const torch::Tensor& labels,
                      const torch::Tensor& mask, int64_t vocab_size);

// Hugging Face's loss with labels = input_ids: logits at t predict ids at t+1, mean over all
// B*(T-1) predicted positions.
torch::Tensor lm_loss_all(const torch::Tensor& logits, const torch::Tensor& ids,
                          int64_t vocab_size);

// Sum (not mean) of the same per-position losses, for pooling over sequences of different length.
torch::Tensor lm_loss_all_sum(const torch::Tensor& logits, const torch::Tensor& ids,
                              int64_t vocab_size);

}  // namespace gpt2p::model
