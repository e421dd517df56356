#include "gpt2p/parallel/data_parallel/zero.h"

#include <ATen/ops/_foreach_mul.h>

#include <algorithm>
#include <chrono>

#include "gpt2p/compat/version.h"
#include "gpt2p/core/error.h"
#include "gpt2p/parallel/data_parallel/grad_norm.h"

namespace gpt2p::parallel {
namespace {

using Clock = std::chrono::steady_clock;

// Shards start 256 bytes apart in float32: the vectorised kernels' alignment, whatever D is.
constexpr int64_t kAlignElements = 64;

BucketOptions sharded(BucketOptions o, int parts) {
  o.align = kAlignElements;
  o.parts = parts;
  return o;
}

}  // namespace

ShardedAdamW::ShardedAdamW(std::vector<torch::Tensor> params, comm::Communicator& comm,
                           ZeroOptions options)
    : params_(std::move(params)), comm_(comm), options_(std::move(options)) {
  GPT2P_CHECK(!params_.empty(), "--zero 1: no parameters to shard", "this is a bug");
  for (const auto& p : params_) {
    GPT2P_CHECK(p.scalar_type() == torch::kFloat32 && p.device() == params_.front().device(),
                "--zero 1 shards float32 parameters on one device, got " << p.scalar_type()
                                                                         << " on " << p.device(),
                "keep the master weights in float32 (--precision bf16 autocasts)");
  }
  GPT2P_CHECK(!options_.sparse_tied.defined() || options_.overlap,
              "--zero 1: the sparse embedding sync needs the overlapped reduction",
              "this is a bug");
  const auto on_ready = [this](size_t b) { launch(b); };
  buckets_ = std::make_unique<GradBuckets>(params_, sharded(options_.buckets, comm_.size()),
                                           on_ready, options_.overlap);
  const int ranks = comm_.size();
  const auto& buckets = buckets_->buckets();
  torch::NoGradGuard no_grad;
  for (size_t b = 0; b < buckets.size(); ++b) {
    auto flat = torch::zeros({buckets[b].numel}, params_.front().options());
    // The parameters become views of their bucket, values kept.
    for (size_t s : buckets[b].slots) {
      auto p = buckets_->slots()[s].param;
      auto view = buckets_->view(flat, s);
      view.copy_(p);
      p.set_data(view);
    }
    param_flat_.push_back(flat);
    shard_params_.push_back(shard(flat, b));
    shard_grads_.push_back(
        torch::zeros({buckets[b].numel / ranks}, flat.options().dtype(options_.buckets.dtype)));
    optimizers_.push_back(std::make_unique<compat::FusedAdamW>(
        std::vector<torch::Tensor>{shard_params_.back()}, options_.adam));
  }
  reduce_works_.resize(buckets.size());
  gather_works_.resize(buckets.size());
  gather_inputs_.resize(buckets.size());
  if (options_.sparse_tied.defined()) {
    lookups_ = std::make_unique<LookupGrads>(&comm_, options_.buckets.dtype);
  }
}

torch::Tensor ShardedAdamW::shard(const torch::Tensor& flat, size_t b) const {
  const int64_t n = buckets_->buckets()[b].numel / comm_.size();
  return flat.narrow(0, comm_.rank() * n, n);
}

void ShardedAdamW::begin_backward(bool sync) {
  if (!options_.overlap) return;
  buckets_->arm(sync);
  if (!sync) return;
  first_launch_ = Clock::time_point{};
}

GradSync::EmbeddingGradSink ShardedAdamW::embedding_sink() {
  if (!lookups_) return {};
  return [this](const torch::Tensor& ids, const torch::Tensor& grad) {
    lookups_->add(ids, grad, buckets_->armed());
  };
}

void ShardedAdamW::launch(size_t b) {
  if (first_launch_ == Clock::time_point{}) first_launch_ = Clock::now();
  reduce_works_[b] = comm_.reduce_scatter_async(buckets_->flat(b), shard_grads_[b], options_.op);
}

void ShardedAdamW::end_backward() {
  if (!buckets_->armed()) return;
  backward_end_ = Clock::now();
  buckets_->finish_backward();
  collect();
}

void ShardedAdamW::reduce_now() {
  GPT2P_CHECK(!options_.overlap, "reduce_now() on a ZeRO optimizer that reduces during backward",
              "this is a bug: call begin_backward()/end_backward() instead");
  first_launch_ = Clock::time_point{};
  backward_end_ = Clock::now();
  buckets_->fill_all();
  collect();
}

void ShardedAdamW::collect() {
  torch::NoGradGuard no_grad;
  const auto& buckets = buckets_->buckets();
  const int64_t r = comm_.rank();
  for (size_t b = 0; b < buckets.size(); ++b) {
    reduce_works_[b]->wait();
    auto& g = shard_params_[b].mutable_grad();
    g = shard_grads_[b].scalar_type() == torch::kFloat32 ? shard_grads_[b]
                                                         : shard_grads_[b].to(torch::kFloat32);
  }
  if (lookups_ && lookups_->gathering()) {
    // The token lookup's part of the tied gradient, over the global batch (the same on every
    // rank): this rank adds the slice of it that falls in its shard.
    const auto& tied = options_.sparse_tied;
    const double scale =
        options_.op == comm::ReduceOp::kAvg ? 1.0 / static_cast<double>(comm_.size()) : 1.0;
    const auto part = lookups_->dense(tied.size(0), torch::kFloat32).reshape({-1});
    for (size_t s = 0; s < buckets_->slots().size(); ++s) {
      const auto& slot = buckets_->slots()[s];
      if (!slot.param.is_same(tied)) continue;
      const int64_t n = buckets[slot.bucket].numel / comm_.size();
      const int64_t lo = std::max(slot.offset, r * n);
      const int64_t hi = std::min(slot.offset + tied.numel(), (r + 1) * n);
      if (lo < hi) {
        shard_params_[slot.bucket]
            .mutable_grad()
            .narrow(0, lo - r * n, hi - lo)
            .add_(part.narrow(0, lo - slot.offset, hi - lo), scale);
      }
    }
  }
  // The full-size gradients are in the buckets' reductions now.
  for (auto& p : params_) p.mutable_grad() = torch::Tensor();
  synced_ = true;
}

torch::Tensor ShardedAdamW::shard_sq_norm(const torch::Tensor& uncounted) {
  std::vector<torch::Tensor> grads;
  const auto& slots = buckets_->slots();
  for (size_t b = 0; b < shard_params_.size(); ++b) {
    const auto& members = buckets_->buckets()[b].slots;
    if (uncounted.defined() && std::any_of(members.begin(), members.end(), [&](size_t s) {
          return slots[s].param.is_same(uncounted);
        })) {
      GPT2P_CHECK(members.size() == 1,
                  "--zero 1: the weight left out of the norm shares its bucket",
                  "this is a bug: bucket the tied weight alone (BucketOptions::alone)");
      continue;
    }
    if (shard_params_[b].grad().defined()) grads.push_back(shard_params_[b].grad());
  }
  return grad_sq_norm(grads).to(param_flat_.front().device());
}

void ShardedAdamW::scale_grads(const torch::Tensor& coef) {
  std::vector<torch::Tensor> grads;
  for (auto& p : shard_params_) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  if (grads.empty()) return;
  const auto c = coef.to(grads.front().options());
#if GPT2P_TORCH_AT_LEAST(2, 1)
  at::_foreach_mul_(grads, c);
#else
  for (auto& g : grads) g.mul_(c);
#endif
}

void ShardedAdamW::step() {
  torch::NoGradGuard no_grad;
  const int ranks = comm_.size();
  for (size_t b = 0; b < optimizers_.size(); ++b) {
    optimizers_[b]->step();
    // Out of place: MPI may not read a buffer it writes.
    gather_inputs_[b] = shard_params_[b].clone();
    auto out = param_flat_[b].view({ranks, -1});
    gather_works_[b] = comm_.all_gather_async(gather_inputs_[b], out);
  }
}

void ShardedAdamW::wait_params() {
  for (auto& w : gather_works_) {
    if (w) w->wait();
    w.reset();
  }
  for (auto& t : gather_inputs_) t = torch::Tensor();
}

SyncTimes ShardedAdamW::finish_step() {
  if (!synced_) return {};
  synced_ = false;
  for (auto& w : reduce_works_) w->synchronize();
  return sync_times(first_launch_, backward_end_, Clock::now());
}

std::unique_ptr<compat::FusedAdamW> ShardedAdamW::full_state() {
  wait_params();
  auto full = std::make_unique<compat::FusedAdamW>(params_, options_.adam);
  torch::NoGradGuard no_grad;
  const auto& buckets = buckets_->buckets();
  const int ranks = comm_.size();
  // Every rank takes part in every gather, whether or not its shard has state yet: all have the
  // same step count (they step together).
  for (size_t b = 0; b < buckets.size(); ++b) {
    const auto* st = compat::adamw_state(*optimizers_[b], shard_params_[b]);
    const auto flag = torch::tensor({st != nullptr ? st->step() : int64_t{-1}});
    auto steps = comm_.all_gather(flag.to(param_flat_[b].device())).cpu();
    GPT2P_CHECK(torch::all(steps == steps[0]).item<bool>(),
                "--zero 1: the ranks' optimizer shards are at different steps " << steps,
                "this is a bug: every rank must step every shard");
    const int64_t step = steps[0].item<int64_t>();
    if (step < 0) continue;
    std::vector<torch::Tensor> moments;
    for (const auto& m : {st->exp_avg(), st->exp_avg_sq()}) {
      auto all = torch::empty({ranks, m.numel()}, m.options());
      comm_.all_gather_async(m.contiguous(), all)->wait();
      moments.push_back(all.view({-1}));
    }
    for (size_t s : buckets[b].slots) {
      compat::set_adamw_state(*full, buckets_->slots()[s].param, step,
                              buckets_->view(moments[0], s).clone(),
                              buckets_->view(moments[1], s).clone());
    }
  }
  return full;
}

void ShardedAdamW::load_state(torch::optim::Optimizer& full) {
  torch::NoGradGuard no_grad;
  const auto& buckets = buckets_->buckets();
  for (size_t b = 0; b < buckets.size(); ++b) {
    auto exp_avg = torch::zeros_like(param_flat_[b]);
    auto exp_avg_sq = torch::zeros_like(param_flat_[b]);
    int64_t step = -1;
    for (size_t s : buckets[b].slots) {
      const auto& p = buckets_->slots()[s].param;
      const auto* st = compat::adamw_state(full, p);
      if (st == nullptr) continue;
      GPT2P_CHECK(
          step < 0 || st->step() == step,
          "the optimizer state to shard has parameters at steps " << step << " and " << st->step(),
          "resume from a checkpoint written by one run");
      step = st->step();
      buckets_->view(exp_avg, s).copy_(st->exp_avg());
      buckets_->view(exp_avg_sq, s).copy_(st->exp_avg_sq());
    }
    if (step < 0) continue;
    compat::set_adamw_state(*optimizers_[b], shard_params_[b], step, shard(exp_avg, b).clone(),
                            shard(exp_avg_sq, b).clone());
  }
}

torch::Tensor ShardedAdamW::alone_shard_grad() {
  GPT2P_CHECK(options_.buckets.alone.defined() && shard_params_.front().grad().defined(),
              "--zero 1: no reduced shard of a parameter bucketed alone",
              "this is a bug: bucket the tied weight alone and reduce before exchanging it");
  return shard_params_.front().mutable_grad();
}

int64_t ShardedAdamW::state_bytes() const {
  int64_t n = 0;
  for (const auto& b : buckets_->buckets()) n += b.numel / comm_.size();
  return 2 * n * static_cast<int64_t>(sizeof(float));
}

int64_t ShardedAdamW::unsharded_state_bytes() const {
  int64_t n = 0;
  for (const auto& p : params_) n += p.numel();
  return 2 * n * static_cast<int64_t>(sizeof(float));
}

torch::Tensor clip_sharded_grad_norm(const std::vector<ShardedAdamW*>& shards,
                                     const std::vector<torch::Tensor>& uncounted,
                                     const std::vector<comm::Communicator*>& over, double max_norm,
                                     double inv_scale) {
  GPT2P_CHECK(!shards.empty(), "no sharded gradients to clip", "this is a bug");
  torch::Tensor sq;
  for (size_t i = 0; i < shards.size(); ++i) {
    const auto part =
        shards[i]->shard_sq_norm(i < uncounted.size() ? uncounted[i] : torch::Tensor());
    sq = sq.defined() ? sq + part : part;
  }
  sq = sq.reshape({1});
  for (auto* c : over) {
    if (c == nullptr || c->size() == 1) continue;
    if (c->device() == sq.device()) {
      c->all_reduce(sq, comm::ReduceOp::kSum);
    } else {
      auto there = sq.to(c->device());
      c->all_reduce(there, comm::ReduceOp::kSum);
      sq = there.to(sq.device());
    }
  }
  auto norm = sq.sqrt().reshape({});
  if (inv_scale != 1.0) norm = norm * inv_scale;
  const auto coef = unscale_clip_factor(norm, max_norm, inv_scale, torch::kFloat32);
  if (coef.defined()) {
    for (auto* s : shards) s->scale_grads(coef);
  }
  return norm;
}

}  // namespace gpt2p::parallel
