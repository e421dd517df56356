// ZeRO stage 1 (--zero 1): the AdamW state sharded over the data-parallel ranks.
//
// The parameters are laid out in the gradient buckets' order (grad_buckets.h), each bucket split
// into D equal shards, rank r owning shard r of every bucket. The parameters themselves become
// views into one flat buffer per bucket, so that a shard is a plain slice of them. A step:
//   1. backward fills the buckets (hooks, as bucketed DP does); each bucket is reduce-scattered as
//      soon as it is complete, overlapping the rest of backward: rank r gets the average (or sum)
//      of shard r;
//   2. clipping takes the global norm from every rank's shards (a scalar all-reduce);
//   3. AdamW (compat::FusedAdamW: torch's own update, one optimizer per bucket's shard) updates
//      shard r of the parameters, and each bucket's shard is all-gathered back into every rank's
//      parameters as soon as its update is queued (on a GPU the gathers of early buckets run
//      while later buckets update); wait_params() before the next forward orders it after them.
// Each rank keeps exp_avg and exp_avg_sq for 1/D of the parameters; gradients stay full size
// (that is ZeRO-2's saving, not this). The replicas stay bitwise equal: every rank receives the
// same gathered bits.
//
// Checkpoints keep the unsharded format: full_state() gathers every rank's shards into an
// ordinary torch::optim::AdamW of the model's parameters (collective), and load_state() takes a
// shard from one. So a ZeRO run resumes at any D, or without ZeRO, and back.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "gpt2p/comm/communicator.h"
#include "gpt2p/compat/adamw.h"
#include "gpt2p/parallel/data_parallel/grad_buckets.h"
#include "gpt2p/parallel/data_parallel/grad_sync.h"

namespace gpt2p::parallel {

struct ZeroOptions {
  torch::optim::AdamWOptions adam{1e-3};
  BucketOptions buckets;  // dtype: the dtype gradients travel in; align and parts are set here
  // kAvg for data parallelism (each rank's loss is the mean of its share); kSum for pipeline
  // replicas, whose losses are already their share of the global batch's mean.
  comm::ReduceOp op = comm::ReduceOp::kAvg;
  // Reduce during backward through hooks; false: reduce_now() after backward (pipelines, whose
  // schedule accumulates over micro-batches and whose tied weight is summed first).
  bool overlap = true;
  // The tied weight whose token-lookup part comes through embedding_sink() (sparse sync), or
  // undefined. Only with overlap.
  torch::Tensor sparse_tied;
};

class ShardedAdamW {
 public:
  // `params` (a model's, on one device, float32) are re-pointed into the flat buffers with their
  // values kept; call it after the replicas were made equal (every rank passes the same values).
  ShardedAdamW(std::vector<torch::Tensor> params, comm::Communicator& comm, ZeroOptions options);
  ShardedAdamW(const ShardedAdamW&) = delete;
  ShardedAdamW& operator=(const ShardedAdamW&) = delete;

  // Around each micro-step's backward, as GradSync's: `sync` = the step's last.
  void begin_backward(bool sync);
  // After the syncing backward: every bucket's reduce-scatter is queued and this rank's shard
  // gradients will hold the result (NCCL: ordered on torch's current stream); parameters' .grad
  // are reset.
  void end_backward();
  GradSync::EmbeddingGradSink embedding_sink();
  // Without overlap: copies every .grad into the buckets and reduce-scatters them.
  void reduce_now();

  // This rank's squared norm of its shard gradients (float64 scalar on the device), leaving out
  // the buckets of `uncounted` (the head's copy of a tied weight), if given.
  torch::Tensor shard_sq_norm(const torch::Tensor& uncounted = {});
  // Multiplies the shard gradients by `coef` (a scalar tensor or number).
  void scale_grads(const torch::Tensor& coef);
  // Updates this rank's shards and starts the all-gathers of the parameters.
  void step();
  // Orders the next use of the parameters after the gathers (NCCL: no host wait; MPI: waits).
  void wait_params();
  // Blocks until the step's reduce-scatters are done; their times (as GradSync::finish_step()).
  SyncTimes finish_step();

  // The unsharded state, as a plain AdamW over the parameters would hold it (collective).
  std::unique_ptr<compat::FusedAdamW> full_state();
  // Takes this rank's shards of `full`'s state (an AdamW over the same parameters, e.g. loaded
  // from a checkpoint). Parameters are not touched.
  void load_state(torch::optim::Optimizer& full);

  // With BucketOptions::alone: this rank's shard of that parameter's reduced gradient (bucket 0
  // holds it alone, so two optimizers with equal shapes and D shard it alike). After a reduce.
  torch::Tensor alone_shard_grad();

  // Bytes of AdamW state (exp_avg, exp_avg_sq) this rank holds, and what it would unsharded.
  int64_t state_bytes() const;
  int64_t unsharded_state_bytes() const;
  int ranks() const { return comm_.size(); }
  const std::vector<torch::Tensor>& params() const { return params_; }

 private:
  void launch(size_t bucket);
  // Waits for the reduce-scatters; the shard gradients become the shards' .grad.
  void collect();
  // Shard r of bucket b of `flat`.
  torch::Tensor shard(const torch::Tensor& flat, size_t b) const;

  std::vector<torch::Tensor> params_;
  comm::Communicator& comm_;
  ZeroOptions options_;
  std::vector<torch::Tensor> param_flat_;    // per bucket: the parameters' storage
  std::vector<torch::Tensor> shard_params_;  // per bucket: this rank's slice of param_flat_
  std::vector<torch::Tensor> shard_grads_;   // per bucket: reduce-scatter results (travel dtype)
  std::vector<std::unique_ptr<compat::FusedAdamW>> optimizers_;  // per bucket, one shard each
  // Declared after the buffers they write: destroyed first, each Work waits for its operation
  // (or, when an error unwinds, abandons it without waiting: communicator.h).
  std::vector<comm::WorkPtr> reduce_works_, gather_works_;
  std::vector<torch::Tensor> gather_inputs_;
  std::unique_ptr<LookupGrads> lookups_;
  std::unique_ptr<GradBuckets> buckets_;  // last: its hooks use the members above
  bool synced_ = false;
  std::chrono::steady_clock::time_point first_launch_{}, backward_end_{};
};

// torch's clip_grad_norm_ over sharded gradients: the squared norms of this rank's `shards`
// (leaving out uncounted[i] in shards[i], where given) summed over each communicator in `over` in
// turn (together: every rank holding another shard or stage; one communicator over them all gives
// every rank the same bits, which ranks holding copies of one weight need), then every shard
// gradient scaled by min(1, max_norm / (norm + 1e-6)) (and inv_scale: loss scaling's, as
// grad_norm.h; max_norm 0: no clipping). Queued on the device where `over` is; returns the true
// norm as a tensor on the shards' device.
torch::Tensor clip_sharded_grad_norm(const std::vector<ShardedAdamW*>& shards,
                                     const std::vector<torch::Tensor>& uncounted,
                                     const std::vector<comm::Communicator*>& over, double max_norm,
                                     double inv_scale = 1.0);

}  // namespace gpt2p::parallel
