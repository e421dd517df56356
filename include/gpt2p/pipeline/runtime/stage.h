// A pipeline stage: the part of the model one rank holds, seen through the few calls the executor
// (executor.h) makes. The executor owns the order of work and what backward needs (the stage input
// with requires_grad and the output, per micro-batch); a Stage only computes.
//
// GptStage is the real one: a GPT2 built for a layer range, the step's batch cut into
// micro-batches, and on the last stage the loss. GptEvalStage runs the same model forward only,
// for the validation loss. The free functions below finish a pipeline step:
// the tied embedding/head gradient shared by the first and last stage, and clipping by the global
// norm.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "gpt2p/comm/communicator.h"
#include "gpt2p/compat/cuda_graph.h"
#include "gpt2p/model/gpt2.h"
#include "gpt2p/pipeline/runtime/stage_graphs.h"

namespace gpt2p::pipeline {

class Stage {
 public:
  virtual ~Stage() = default;
  virtual bool is_first() const = 0;
  virtual bool is_last() const = 0;
  // The first stage's input of micro-batch `mb` (token ids).
  virtual torch::Tensor input(int mb) = 0;
  // An uninitialised buffer shaped like the activation this (non-first) stage receives for `mb`.
  virtual torch::Tensor empty_activation(int mb) = 0;
  // Non-last stages return the activation to send on; the last stage returns the micro-batch's
  // loss (a scalar to call backward on).
  virtual torch::Tensor forward(int mb, const torch::Tensor& input) = 0;
  // Back-propagates `output` of `mb`: output.backward() when `grad` is undefined (the loss), else
  // torch::autograd::backward({output}, {grad}). Gradients accumulate into the parameters (a
  // stage may add some of them once per step, after its last backward).
  virtual void backward(int mb, const torch::Tensor& output, const torch::Tensor& grad) = 0;
  // Zero-bubble schedules (schedule.h): backward() computed only what the previous stage waits
  // for; this adds the weight gradients it left for `mb`. Stages that do not split their backward
  // throw.
  virtual void backward_weight(int mb);
};

// The tensors of one step's batch on this stage's device; a stage uses what it needs (the first
// stage the inputs, the last the labels and mask; every stage the shape).
struct StageBatch {
  torch::Tensor inputs, labels, mask;  // [B, T]: int64, int64, float32
  int64_t global_target_tokens = 0;    // sum of mask over the whole batch (loss scaling)
  torch::Tensor host_mask;             // optional: mask on the host (spares a device read)
  // The loss's gradients are this many times the true ones (fp16's dynamic loss scaling:
  // parallel/train/loss_scaler.h); take_loss() still returns the true loss.
  double loss_scale = 1.0;
};

// What a GPT-2 stage of either pass shares: its model (a layer range), the step's batch cut into
// n_microbatches row blocks, the first stage's inputs and the shape of what it receives.
class GptStageBase : public Stage {
 public:
  bool is_first() const override { return model_->has_embedding(); }
  bool is_last() const override { return model_->has_head(); }
  torch::Tensor input(int mb) override;
  torch::Tensor empty_activation(int mb) override;

 protected:
  // `autocast`: the type forward autocasts to (model::autocast_type; torch::kFloat32 for none).
  GptStageBase(model::GPT2 model, int n_microbatches, torch::ScalarType autocast);
  // Keeps `batch` after checking that its rows split into the micro-batches.
  void store_batch(StageBatch batch);
  // mb, after checking that a batch is set and holds it (throws otherwise).
  int check_microbatch(int mb) const;
  // Micro-batch mb's rows of t.
  torch::Tensor rows(const torch::Tensor& t, int mb) const;

  model::GPT2 model_;
  int n_microbatches_;
  torch::ScalarType autocast_;
  StageBatch batch_;
  int64_t micro_rows_ = 0;
};

class GptStage : public GptStageBase {
 public:
  // `model` holds this stage's layer range; the step's batch is cut into n_microbatches row blocks.
  // The last stage computes the head at `positions` (lm_head_loss.h). `autocast`: the type
  // forward autocasts to (model::autocast_type; torch::kFloat32 for none).
  // With split_backward, backward() leaves the blocks' weight gradients for backward_weight()
  // (model/deferred_linear.h).
  GptStage(model::GPT2 model, int n_microbatches, torch::ScalarType autocast,
           model::LossPositions positions = model::LossPositions::kTargets,
           bool split_backward = false);
  ~GptStage() override;  // takes sum_lookup_grads_per_step's sink off the model it leaves
  GptStage(const GptStage&) = delete;
  GptStage& operator=(const GptStage&) = delete;

  void set_batch(StageBatch batch);
  // Called right before the step's last backward on this stage (the n_microbatches-th, counted
  // from set_batch): when that backward starts, every earlier micro-batch's backward has added
  // its gradients to .grad (zero bubble's deferred weight gradients excepted: their W's may come
  // later; and with sum_lookup_grads_per_step the token lookup's part of wte's, added after the
  // last backward), so a data-parallel sum over replicas can start as this one produces each
  // gradient.
  void set_last_backward_hook(std::function<void()> hook) { last_backward_hook_ = std::move(hook); }

  // From the next set_batch on, forward and backward run as CUDA graphs (stage_graphs.h), one
  // pair per micro-batch, from `pool` (the rank's stages share one). The parameters' gradients
  // then stay allocated: zero them in place between steps, never reset them. Not with
  // split_backward (its weight gradients are deferred outside backward).
  void use_graphs(std::shared_ptr<compat::GraphPool> pool);
  // Steps whose micro-batches ran as graphs (0 without use_graphs).
  int64_t graphed_steps() const { return graphs_ ? graphs_->graphed_steps() : 0; }
  // First stage: the token lookup's part of wte's gradient once per step, not once per
  // micro-batch. Autograd's lookup backward fills a dense [vocabulary, C] gradient and adds it to
  // .grad for every micro-batch (at GPT-2's vocabulary 154 MB in fp32 each time). Instead each
  // micro-batch's backward copies the lookup's output gradient into its rows of one [B, T, C]
  // buffer (a graphed backward into the same rows at every replay), and the step's last backward
  // turns the buffer and the batch's ids into the dense gradient once and adds it to .grad. Only
  // where nothing reads wte's .grad before the step's backwards end: not with a sum over
  // replicas, whose hooks take each gradient as autograd completes it. No-op on other stages
  // and at one micro-batch (the plain lookup already makes one dense gradient a step). The
  // stage owns the model's embedding gradient sink (GPT2Impl::set_embedding_grad_sink) until it
  // is destroyed; a model with a sink already is refused.
  void sum_lookup_grads_per_step();
  // Last stage: the sum of this step's micro-batch losses (= the batch's mean masked CE), and
  // resets it. Other stages: 0.
  double take_loss();

  torch::Tensor forward(int mb, const torch::Tensor& input) override;
  void backward(int mb, const torch::Tensor& output, const torch::Tensor& grad) override;
  void backward_weight(int mb) override;

 private:
  model::LossPositions positions_;
  std::vector<model::LossRows> loss_rows_;  // last stage: per micro-batch
  torch::Tensor loss_sum_;
  std::shared_ptr<model::WeightGradStore> weight_grads_;  // split_backward only
  std::function<void()> last_backward_hook_;
  int backwards_ = 0;  // this step's backward calls so far
  // sum_lookup_grads_per_step: the step's lookup output gradients [B, T, C], the micro-batch
  // whose backward runs (the rows its lookup's gradient goes to), and the host's count of this
  // step's copies into the buffer (replays copy without it).
  bool lookup_per_step_ = false;
  torch::Tensor lookup_grads_;
  int backward_mb_ = 0;
  int lookup_calls_ = 0;
  void size_lookup_grads(const torch::Tensor& ids);
  void add_lookup_grads();
  std::unique_ptr<StageGraphs> graphs_;     // use_graphs
  std::vector<torch::Tensor> live_inputs_;  // graphed: the executor's input of each micro-batch
};

// Evaluation through the pipeline, forward only (Executor with Pass::kForwardOnly): the batch cut
// into micro-batches as GptStage does, each stage's output handed on in fp32. The last stage runs
// its whole range, head included, under autocast and takes model::lm_loss of the fp32 logits
// outside it, as evaluating one whole model does; it adds each micro-batch's mean times its target
// count (micro-batches without targets add nothing) and the count, in double.
class GptEvalStage : public GptStageBase {
 public:
  // `autocast` as for GptStage.
  GptEvalStage(model::GPT2 model, int n_microbatches, torch::ScalarType autocast);

  // Uses the batch's inputs, labels and mask.
  void set_batch(StageBatch batch);
  struct Totals {
    double loss_sum = 0;  // sum over the micro-batches of masked mean CE x target count
    double tokens = 0;    // target count
  };
  // Last stage: the totals since the last call, and resets them. Other stages: zeros.
  Totals take_totals();

  // Non-last stages: the activation; the last stage: the fp32 logits (after adding to the totals).
  torch::Tensor forward(int mb, const torch::Tensor& input) override;
  // Throws: evaluation computes no gradients.
  void backward(int mb, const torch::Tensor& output, const torch::Tensor& grad) override;

 private:
  Totals totals_;
};

}  // namespace gpt2p::pipeline
