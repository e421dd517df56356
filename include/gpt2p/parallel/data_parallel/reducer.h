// One object per model part that turns each rank's gradients into an optimizer step over its
// data-parallel group (Megatron-core's DistributedDataParallel and DistributedOptimizer in one):
// the step calls begin_backward / finish_grad_sync around backward, then clip_grad_norm and step,
// whatever the kind. Which kind reduces how is decided once, at setup (make_reducer):
//
//   none       one rank: the gradients stay as backward left them
//   per-param  HW5's average_gradients: one all_reduce per parameter after backward
//   bucketed   buckets all-reduced while backward runs (grad_sync.h)
//   zero-1     buckets reduce-scattered while backward runs; each rank updates its shard of the
//              AdamW state and all-gathers the parameters (zero.h)
//
// The replicated kinds (none, per-param, bucketed) own a plain AdamW over the part's parameters;
// zero-1 owns the shards.
#pragma once

#include <torch/types.h>

#include <memory>
#include <string>
#include <vector>

#include "gpt2p/comm/communicator.h"
#include "gpt2p/compat/adamw.h"
#include "gpt2p/model/gpt2.h"
#include "gpt2p/parallel/data_parallel/grad_sync.h"

namespace gpt2p::parallel {

enum class ReducerKind { kNone, kPerParam, kBucketed, kSharded };

struct ReducerOptions {
  ReducerKind kind = ReducerKind::kBucketed;
  comm::Communicator* group = nullptr;  // the part's data-parallel ranks (kNone: unused)
  // kAvg: data parallelism (each rank's loss is the mean of its share); kSum: a pipeline stage's
  // replicas, whose losses are already their share of the global batch's mean. Bucketed with
  // kSum is the replicas' sum of replica_grad_sync.h (float32, armed by the stage's last
  // backward, what no hook saw added after the schedule).
  comm::ReduceOp op = comm::ReduceOp::kAvg;
  // zero-1: reduce-scatter during backward (hooks); false: all of it after the schedule
  // (pipelines, whose schedule accumulates over micro-batches).
  bool overlap = true;
  // zero-1: the parameter that gets a bucket of its own (a pipeline's tied weight, so the first
  // and the last stage shard it alike), or undefined.
  torch::Tensor alone;
  double bucket_mb = 25;
  torch::ScalarType dtype = torch::kFloat32;  // the dtype gradients travel in
  // The tied weight whose token-lookup gradient is all-gathered as rows instead of reduced
  // densely (bucketed and zero-1; grad_sync.h), or undefined.
  torch::Tensor sparse_tied;
};

class GradReducer {
 public:
  virtual ~GradReducer() = default;
  // "none", "per-param", "bucketed" or "zero-1" (the start-up line).
  virtual std::string name() const = 0;

  // Before a micro-step's backward: `sync` = this backward ends the step.
  virtual void begin_backward(bool sync) = 0;
  // After the step's last backward: the reductions are queued (NCCL: ordered on torch's current
  // stream) and the gradients the optimizer reads will hold the result.
  virtual void finish_grad_sync() = 0;
  // What to pass to GPT2Impl::set_embedding_grad_sink (empty: the tied weight goes densely).
  virtual GradSync::EmbeddingGradSink embedding_sink() = 0;

  // The part is the whole model (data parallelism): its global gradient norm over the group,
  // the gradients scaled by inv_scale * min(1, max_norm / (norm + 1e-6)) (max_norm 0: no
  // clipping; grad_norm.h). Queued on the device; returns the true norm (float64 scalar).
  virtual torch::Tensor clip_grad_norm(double max_norm, double inv_scale) = 0;
  // Multiplies the gradients the optimizer reads by `coef` (fault injection: NaN).
  virtual void scale_grads(const torch::Tensor& coef) = 0;
  // After finish_grad_sync: the reduced gradient of the part's parameter `tied` as the optimizer
  // will read it -- its .grad, or this rank's shard of it (zero-1, with `tied` as `alone`) --
  // for the tied weight's exchange between a pipeline's first and last stage.
  virtual torch::Tensor tied_grad(const torch::Tensor& tied) = 0;

  // The optimizer step (zero-1: this rank's shards, then the parameters' all-gathers start).
  virtual void step() = 0;
  // Resets the parameters' .grad to undefined: the next step's first backward starts afresh.
  virtual void zero_grad() = 0;
  // Zeroes the parameters' .grad in place instead, keeping them where they are: CUDA graphs that
  // add into them (pipeline/runtime/stage_graphs.h). The replicated kinds only.
  virtual void zero_grad_in_place();
  // Blocks until the step's reductions are done; their times (GradSync::finish_step).
  virtual SyncTimes finish_step() = 0;
  // Orders the next use of the parameters after the step's all-gathers (zero-1; else nothing).
  virtual void wait_params() {}

  // CUDA graphs (compat/cuda_graph.h): whether a step's device work, from begin_backward to
  // step(), can be captured in a graph -- nothing in it waits on the host or on other ranks. So
  // far one rank's reducer (none) whose last step() took AdamW's fused path.
  virtual bool capturable() const { return false; }
  // After each replay of a graph that captured a step(): the host's part of that step (AdamW's
  // step counts), which the replay does not run.
  virtual void count_replayed_step() {}

  // The optimizer state a checkpoint saves: the part's AdamW, or (zero-1, collective over the
  // group) the shards gathered into `scratch`, which must outlive the save.
  virtual const torch::optim::Optimizer& checkpoint_state(
      std::unique_ptr<compat::FusedAdamW>& scratch) = 0;
  // Bytes of AdamW state (exp_avg, exp_avg_sq) this rank holds, and what it would unsharded.
  virtual int64_t state_bytes() const = 0;
  virtual int64_t unsharded_state_bytes() const = 0;
};

// The reducer of `options.kind` over `params` (one device, after the replicas were made equal).
// `optimizer`: a plain AdamW over `params`, fresh or holding a checkpoint's state; the replicated
// kinds step it, zero-1 takes its options and its shards of the state (re-pointing `params` into
// its buckets, values kept) and drops it.
std::unique_ptr<GradReducer> make_reducer(std::vector<torch::Tensor> params,
                                          std::unique_ptr<compat::FusedAdamW> optimizer,
                                          const ReducerOptions& options);

// A pipeline rank's step, between the schedule and the optimizer: `parts[c]` reduces `stages[c]`
// over its replicas (all of one kind). sum_tied_gradient: the tied weight's two halves, on the
// first and the last stage of `pipeline`, both end up with their sum (as the optimizer reads them:
// .grad or zero-1's shards); a no-op on a pipeline of one rank. clip_pipeline_grad_norm: the norm
// over every stage of every rank (the head's copy of the tied weight left out), the gradients
// clipped and unscaled as GradReducer::clip_grad_norm; `control` (every rank of the job) carries
// zero-1's sum of shard norms. Returns the norm (the host waits for it). Every rank calls both.
void sum_tied_gradient(const std::vector<GradReducer*>& parts,
                       const std::vector<model::GPT2>& stages, comm::Communicator& pipeline);
double clip_pipeline_grad_norm(const std::vector<GradReducer*>& parts,
                               const std::vector<model::GPT2>& stages, comm::Communicator& pipeline,
                               comm::Communicator& control, double max_norm, double inv_scale);

}  // namespace gpt2p::parallel
