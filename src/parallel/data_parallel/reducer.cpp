#include "gpt2p/parallel/data_parallel/reducer.h"

#include <ATen/ops/_foreach_zero.h>

#include <utility>

#include "gpt2p/core/error.h"
#include "gpt2p/parallel/data_parallel/grad_norm.h"
#include "gpt2p/parallel/data_parallel/replica_grad_sync.h"
#include "gpt2p/parallel/data_parallel/zero.h"

namespace gpt2p::parallel {
namespace {

// none, per-param, bucketed: every rank holds the whole AdamW state and steps it on the reduced
// gradients.
class ReplicatedReducer final : public GradReducer {
 public:
  ReplicatedReducer(std::vector<torch::Tensor> params, std::unique_ptr<GradSync> sync,
                    std::unique_ptr<compat::FusedAdamW> optimizer)
      : params_(std::move(params)), sync_(std::move(sync)), optimizer_(std::move(optimizer)) {}

  std::string name() const override { return sync_->name(); }
  void begin_backward(bool sync) override { sync_->begin_backward(sync); }
  void finish_grad_sync() override { sync_->end_backward(); }
  GradSync::EmbeddingGradSink embedding_sink() override { return sync_->embedding_sink(); }

  torch::Tensor clip_grad_norm(double max_norm, double inv_scale) override {
    return clip_grad_norm_queued(params_, max_norm, inv_scale);
  }
  void scale_grads(const torch::Tensor& coef) override {
    for (auto& p : params_) {
      if (p.grad().defined()) p.mutable_grad().mul_(coef);
    }
  }
  torch::Tensor tied_grad(const torch::Tensor& tied) override {
    GPT2P_CHECK(tied.defined() && tied.grad().defined(),
                "a stage holding an end of the model has no gradient for the tied wte weight",
                "this is a bug: run the step's backward before summing the tied gradient");
    return tied.grad();
  }

  void step() override { optimizer_->step(); }
  void zero_grad() override {
    for (auto& p : params_) p.mutable_grad() = torch::Tensor();
  }
  void zero_grad_in_place() override {
    std::vector<torch::Tensor> grads;
    for (auto& p : params_) {
      if (p.grad().defined()) grads.push_back(p.mutable_grad());
    }
    if (!grads.empty()) at::_foreach_zero_(grads);
  }
  SyncTimes finish_step() override { return sync_->finish_step(); }
  bool capturable() const override { return sync_->capturable() && optimizer_->last_step_fused(); }
  void count_replayed_step() override { optimizer_->count_replayed_step(); }

  const torch::optim::Optimizer& checkpoint_state(
      std::unique_ptr<compat::FusedAdamW>& /*scratch*/) override {
    return *optimizer_;
  }
  int64_t state_bytes() const override { return unsharded_state_bytes(); }
  int64_t unsharded_state_bytes() const override {
    int64_t bytes = 0;
    for (const auto& p : params_) bytes += 2 * p.numel() * static_cast<int64_t>(sizeof(float));
    return bytes;
  }

 private:
  std::vector<torch::Tensor> params_;
  std::unique_ptr<GradSync> sync_;
  std::unique_ptr<compat::FusedAdamW> optimizer_;
};

// zero-1: ShardedAdamW (zero.h) behind the reducer's calls.
class ShardedReducer final : public GradReducer {
 public:
  ShardedReducer(std::unique_ptr<ShardedAdamW> zero, comm::Communicator& group, bool overlap)
      : zero_(std::move(zero)), group_(group), overlap_(overlap) {}

  std::string name() const override { return "zero-1"; }
  void begin_backward(bool sync) override { zero_->begin_backward(sync); }
  void finish_grad_sync() override { overlap_ ? zero_->end_backward() : zero_->reduce_now(); }
  GradSync::EmbeddingGradSink embedding_sink() override { return zero_->embedding_sink(); }

  torch::Tensor clip_grad_norm(double max_norm, double inv_scale) override {
    return clip_sharded_grad_norm({zero_.get()}, {}, {&group_}, max_norm, inv_scale);
  }
  void scale_grads(const torch::Tensor& coef) override { zero_->scale_grads(coef); }
  torch::Tensor tied_grad(const torch::Tensor& /*tied: the alone bucket's*/) override {
    return zero_->alone_shard_grad();
  }
  ShardedAdamW& shards() { return *zero_; }

  void step() override { zero_->step(); }
  void zero_grad() override {
    for (auto p : zero_->params()) p.mutable_grad() = torch::Tensor();
  }
  SyncTimes finish_step() override { return zero_->finish_step(); }
  void wait_params() override { zero_->wait_params(); }

  const torch::optim::Optimizer& checkpoint_state(
      std::unique_ptr<compat::FusedAdamW>& scratch) override {
    scratch = zero_->full_state();
    return *scratch;
  }
  int64_t state_bytes() const override { return zero_->state_bytes(); }
  int64_t unsharded_state_bytes() const override { return zero_->unsharded_state_bytes(); }

 private:
  std::unique_ptr<ShardedAdamW> zero_;
  comm::Communicator& group_;
  const bool overlap_;
};

}  // namespace

void GradReducer::zero_grad_in_place() {
  GPT2P_FAIL("the " << name() << " reducer cannot keep its gradients in place",
             "this is a bug: CUDA graphs run only with a replicated reducer");
}

std::unique_ptr<GradReducer> make_reducer(std::vector<torch::Tensor> params,
                                          std::unique_ptr<compat::FusedAdamW> optimizer,
                                          const ReducerOptions& options) {
  GPT2P_CHECK(optimizer != nullptr, "make_reducer: no optimizer",
              "this is a bug: pass the part's AdamW");
  GPT2P_CHECK(options.kind == ReducerKind::kNone || options.group != nullptr,
              "make_reducer: a reducing kind without a group",
              "this is a bug: pass the part's data-parallel communicator");
  switch (options.kind) {
    case ReducerKind::kNone:
      return std::make_unique<ReplicatedReducer>(std::move(params), make_no_sync(),
                                                 std::move(optimizer));
    case ReducerKind::kBucketed:
      if (options.op == comm::ReduceOp::kSum) {
        GPT2P_CHECK(!options.sparse_tied.defined(),
                    "make_reducer: the replicas' sum reduces the tied weight densely",
                    "this is a bug: pass no sparse_tied with kSum");
        auto sum = std::make_unique<ReplicaGradSync>(params, *options.group, options.bucket_mb);
        return std::make_unique<ReplicatedReducer>(std::move(params), std::move(sum),
                                                   std::move(optimizer));
      }
      [[fallthrough]];
    case ReducerKind::kPerParam: {
      const auto mode = options.kind == ReducerKind::kPerParam ? GradSyncMode::kPerParam
                                                               : GradSyncMode::kBucketed;
      auto sync = make_grad_sync(mode, options.group, params, options.bucket_mb, options.dtype,
                                 options.sparse_tied);
      return std::make_unique<ReplicatedReducer>(std::move(params), std::move(sync),
                                                 std::move(optimizer));
    }
    case ReducerKind::kSharded: {
      ZeroOptions zo;
      zo.adam = static_cast<const torch::optim::AdamWOptions&>(optimizer->defaults());
      zo.buckets.bucket_mb = options.bucket_mb;
      zo.buckets.dtype = options.dtype;
      zo.buckets.alone = options.alone;
      zo.op = options.op;
      zo.overlap = options.overlap;
      zo.sparse_tied = options.sparse_tied;
      auto zero = std::make_unique<ShardedAdamW>(std::move(params), *options.group, zo);
      // The whole state (a checkpoint's, or none) is sharded; the whole copy is dropped.
      zero->load_state(*optimizer);
      return std::make_unique<ShardedReducer>(std::move(zero), *options.group, options.overlap);
    }
  }
  GPT2P_CHECK(false, "make_reducer: unknown kind", "this is a bug");
  return nullptr;
}

void sum_tied_gradient(const std::vector<GradReducer*>& parts,
                       const std::vector<model::GPT2>& stages, comm::Communicator& pipeline) {
  if (pipeline.size() == 1) return;
  std::vector<torch::Tensor> tied(stages.size());
  for (size_t c = 0; c < stages.size(); ++c) {
    const auto& m = stages[c];
    if ((m->has_embedding() || m->has_head()) && !m->is_full()) {
      tied[c] = parts.at(c)->tied_grad(m->tied_parameter());
    }
  }
  // Zero-1's first and last stage shard the tied weight alike (a bucket of its own), so the sum
  // runs shard to shard; a + b == b + a keeps both copies identical either way.
  sync_tied_gradient(stages, pipeline, tied);
}

double clip_pipeline_grad_norm(const std::vector<GradReducer*>& parts,
                               const std::vector<model::GPT2>& stages, comm::Communicator& pipeline,
                               comm::Communicator& control, double max_norm, double inv_scale) {
  std::vector<ShardedAdamW*> shards;
  for (auto* part : parts) {
    if (auto* sharded = dynamic_cast<ShardedReducer*>(part)) shards.push_back(&sharded->shards());
  }
  GPT2P_CHECK(shards.empty() || shards.size() == parts.size(),
              "a pipeline rank's stages are reduced by different kinds",
              "this is a bug: give every stage the same reducer kind");
  // Replicated: one norm over every stage's .grad, summed over the pipeline's ranks (the
  // replicas hold the same sums).
  if (shards.empty()) return clip_grad_norm_pipeline(stages, &pipeline, max_norm, inv_scale);
  // Zero-1: each rank's shard norms, summed in one all-reduce over every rank, so each gets the
  // same factor, the two copies of the tied weight included.
  std::vector<torch::Tensor> uncounted;  // the head's copy of the tied weight
  for (const auto& m : stages) {
    uncounted.push_back(m->has_embedding() ? torch::Tensor() : m->tied_parameter());
  }
  return clip_sharded_grad_norm(shards, uncounted, {&control}, max_norm, inv_scale).item<double>();
}

}  // namespace gpt2p::parallel
