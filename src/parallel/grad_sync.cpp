#include "gpt2p/parallel/grad_sync.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>

#include "gpt2p/core/error.h"

namespace gpt2p::parallel {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

class NoSync final : public GradSync {
 public:
  void begin_backward(bool /*sync*/) override {}
  void end_backward() override {}
  SyncTimes finish_step() override { return {}; }
  std::string name() const override { return "none"; }
};

// HW5's average_gradients: one all_reduce per parameter, after backward.
class PerParamSync final : public GradSync {
 public:
  PerParamSync(comm::Communicator* comm, std::vector<torch::Tensor> params, torch::ScalarType dtype)
      : comm_(comm), params_(std::move(params)), dtype_(dtype) {}

  void begin_backward(bool sync) override { sync_ = sync; }

  void end_backward() override {
    if (!sync_) return;
    const auto t0 = Clock::now();
    works_.clear();
    for (auto& p : params_) {
      auto& g = p.mutable_grad();
      if (!g.defined()) g = torch::zeros_like(p);
      if (dtype_ == g.scalar_type()) {
        works_.push_back(comm_->all_reduce_async(g, comm::ReduceOp::kAvg));
        works_.back()->wait();
      } else {
        auto low = g.to(dtype_);
        works_.push_back(comm_->all_reduce_async(low, comm::ReduceOp::kAvg));
        works_.back()->wait();
        g.copy_(low);
      }
    }
    host_seconds_ = seconds_since(t0);
  }

  SyncTimes finish_step() override {
    if (!sync_) return {};
    const auto t0 = Clock::now();
    for (auto& w : works_) w->synchronize();
    works_.clear();
    // Every reduction is exposed: nothing else runs while they do.
    const double t = host_seconds_ + seconds_since(t0);
    return {t, t};
  }

  std::string name() const override { return "per-param"; }

 private:
  comm::Communicator* comm_;
  std::vector<torch::Tensor> params_;
  torch::ScalarType dtype_;
  bool sync_ = false;
  std::vector<comm::WorkPtr> works_;
  double host_seconds_ = 0;
};

// Buckets filled by autograd hooks, each reduced asynchronously as soon as it is complete.
class BucketedSync final : public GradSync {
 public:
  BucketedSync(comm::Communicator* comm, const std::vector<torch::Tensor>& params,
               double bucket_mb, torch::ScalarType dtype, torch::Tensor tied)
      : comm_(comm), dtype_(dtype), tied_(std::move(tied)) {
    if (tied_.defined()) {
      GPT2P_CHECK(std::any_of(params.begin(), params.end(),
                              [&](const torch::Tensor& p) { return p.is_same(tied_); }),
                  "the tied embedding weight is not among the parameters to synchronise",
                  "pass the model's own wte weight");
    }
    const auto bytes_per = static_cast<int64_t>(torch::elementSize(dtype));
    const auto capacity = std::max<int64_t>(1, static_cast<int64_t>(bucket_mb * 1024 * 1024) / bytes_per);
    // Reverse registration order approximates the order in which backward produces gradients.
    for (auto it = params.rbegin(); it != params.rend(); ++it) {
      if (buckets_.empty() || buckets_.back().numel + it->numel() > capacity) {
        if (buckets_.empty() || buckets_.back().numel > 0) buckets_.emplace_back();
      }
      auto& b = buckets_.back();
      slots_.push_back({*it, buckets_.size() - 1, b.numel, false, 0});
      b.slots.push_back(slots_.size() - 1);
      b.numel += it->numel();
    }
    for (auto& b : buckets_) {
      b.flat = torch::zeros({b.numel}, torch::TensorOptions().dtype(dtype_).device(params.front().device()));
    }
    for (size_t s = 0; s < slots_.size(); ++s) {
      slots_[s].hook = slots_[s].param.register_hook(
          [this, s](const torch::Tensor& grad) { on_grad(s, grad); });
    }
  }

  ~BucketedSync() override {
    for (auto& s : slots_) s.param.remove_hook(s.hook);
  }
  BucketedSync(const BucketedSync&) = delete;
  BucketedSync& operator=(const BucketedSync&) = delete;

  void begin_backward(bool sync) override {
    // A .grad still viewing its bucket from the last step (kept by zero_grad() instead of reset)
    // gets its own memory, or backward would accumulate into a bucket being filled and reduced.
    for (auto& slot : slots_) {
      auto& g = slot.param.mutable_grad();
      if (g.defined() && g.is_alias_of(buckets_[slot.bucket].flat)) g = g.clone();
    }
    armed_ = sync;
    if (!sync) return;
    for (auto& b : buckets_) {
      b.pending = static_cast<int64_t>(b.slots.size());
      b.work.reset();
    }
    for (auto& s : slots_) s.filled = false;
    first_launch_ = Clock::time_point{};
  }

  EmbeddingGradSink embedding_sink() override {
    if (!tied_.defined()) return {};
    return [this](const torch::Tensor& ids, const torch::Tensor& grad) { on_embedding_grad(ids, grad); };
  }

  void end_backward() override {
    if (!armed_) return;
    armed_ = false;
    backward_end_ = Clock::now();
    // Buckets whose parameters got no gradient this step (unused parameters) go now.
    for (size_t bi = 0; bi < buckets_.size(); ++bi) {
      auto& b = buckets_[bi];
      if (b.work) continue;
      for (size_t s : b.slots) {
        if (!slots_[s].filled) fill(s, torch::Tensor());
      }
      launch(bi);
    }
    for (auto& b : buckets_) {
      b.work->wait();
      for (size_t s : b.slots) {
        auto& slot = slots_[s];
        auto& g = slot.param.mutable_grad();
        auto avg = b.flat.narrow(0, slot.offset, slot.param.numel()).view_as(slot.param);
        // fill() folded any earlier .grad into the bucket: the average replaces it.
        if (avg.scalar_type() == slot.param.scalar_type()) {
          g = avg;
        } else if (!g.defined()) {
          g = avg.to(slot.param.scalar_type());
        } else {
          g.copy_(avg);
        }
      }
    }
    add_embedding_part();
    synced_ = true;
  }

  SyncTimes finish_step() override {
    if (!synced_) return {};
    synced_ = false;
    for (auto& b : buckets_) b.work->synchronize();
    const auto done = Clock::now();
    const auto start = first_launch_ == Clock::time_point{} ? backward_end_ : first_launch_;
    SyncTimes t;
    t.total = std::chrono::duration<double>(done - start).count();
    t.exposed = std::chrono::duration<double>(done - backward_end_).count();
    return t;
  }

  std::string name() const override { return "bucketed"; }

 private:
  struct Slot {
    torch::Tensor param;
    size_t bucket;
    int64_t offset;
    bool filled = false;
    unsigned hook = 0;
  };
  struct Bucket {
    std::vector<size_t> slots;
    int64_t numel = 0;
    int64_t pending = 0;
    torch::Tensor flat;
    comm::WorkPtr work;
  };

  // The hook: runs when backward has produced `grad` for slot s (before it is added to .grad).
  void on_grad(size_t s, const torch::Tensor& grad) {
    if (!armed_ || slots_[s].filled) return;
    fill(s, grad);
    auto& b = buckets_[slots_[s].bucket];
    if (--b.pending == 0) launch(slots_[s].bucket);
  }

  // Copies .grad (earlier micro-steps) + grad (this one) into the slot's part of its bucket.
  void fill(size_t s, const torch::Tensor& grad) {
    auto& slot = slots_[s];
    auto dst = buckets_[slot.bucket].flat.narrow(0, slot.offset, slot.param.numel());
    const auto& acc = slot.param.grad();
    if (grad.defined() && acc.defined()) {
      dst.copy_((acc + grad).reshape({-1}));
    } else if (grad.defined()) {
      dst.copy_(grad.reshape({-1}));
    } else if (acc.defined()) {
      dst.copy_(acc.reshape({-1}));
    } else {
      dst.zero_();
    }
    slot.filled = true;
  }

  // The sink: this micro-step's lookup gradient. Kept until the step's syncing backward, which
  // gathers every micro-step's rows at once.
  void on_embedding_grad(const torch::Tensor& ids, const torch::Tensor& grad) {
    lookup_ids_.push_back(ids.reshape({-1}));
    lookup_grads_.push_back(grad.reshape({-1, grad.size(-1)}).to(dtype_));
    if (!armed_) return;
    const auto cat = [](std::vector<torch::Tensor>& parts) {
      auto all = parts.size() == 1 ? parts.front().contiguous() : torch::cat(parts);
      parts.clear();
      return all;
    };
    gather_ids_ = cat(lookup_ids_);
    gather_grads_ = cat(lookup_grads_);
    const int64_t world = comm_->size();
    ids_all_ = torch::empty({world, gather_ids_.size(0)}, gather_ids_.options());
    grads_all_ = torch::empty({world, gather_grads_.size(0), gather_grads_.size(1)},
                              gather_grads_.options());
    ids_work_ = comm_->all_gather_async(gather_ids_, ids_all_);
    grads_work_ = comm_->all_gather_async(gather_grads_, grads_all_);
  }

  // After the buckets: the tied weight's .grad holds the averaged head part; add the lookup's part
  // of the global batch, divided by the ranks as the average would.
  void add_embedding_part() {
    if (!grads_work_) return;
    ids_work_->wait();
    grads_work_->wait();
    const auto rows = grads_all_.view({-1, grads_all_.size(-1)}).to(tied_.scalar_type());
    auto part = at::embedding_dense_backward(rows, ids_all_.view({-1}), tied_.size(0),
                                             /*padding_idx=*/-1, /*scale_grad_by_freq=*/false);
    const double inv = 1.0 / static_cast<double>(comm_->size());
    auto& g = tied_.mutable_grad();
    if (g.defined()) {
      g.add_(part, inv);
    } else {
      g = part.mul_(inv);
    }
    ids_work_.reset();
    grads_work_.reset();
    gather_ids_ = gather_grads_ = ids_all_ = grads_all_ = torch::Tensor();
  }

  void launch(size_t bi) {
    if (first_launch_ == Clock::time_point{}) first_launch_ = Clock::now();
    buckets_[bi].work = comm_->all_reduce_async(buckets_[bi].flat, comm::ReduceOp::kAvg);
  }

  comm::Communicator* comm_;
  torch::ScalarType dtype_;
  torch::Tensor tied_;  // reduced sparsely when defined
  std::vector<torch::Tensor> lookup_ids_, lookup_grads_;
  torch::Tensor gather_ids_, gather_grads_, ids_all_, grads_all_;
  comm::WorkPtr ids_work_, grads_work_;
  std::vector<Slot> slots_;
  std::vector<Bucket> buckets_;
  bool armed_ = false;
  bool synced_ = false;
  Clock::time_point first_launch_{}, backward_end_{};
};

}  // namespace

std::unique_ptr<GradSync> make_no_sync() { return std::make_unique<NoSync>(); }

std::unique_ptr<GradSync> make_grad_sync(GradSyncMode mode, comm::Communicator* comm,
                                         const std::vector<torch::Tensor>& params,
                                         double bucket_mb, torch::ScalarType reduce_dtype,
                                         const torch::Tensor& tied_embedding) {
  GPT2P_CHECK(comm != nullptr, "gradient sync '" << name_of(mode) << "' needs a communicator",
              "this is a bug");
  GPT2P_CHECK(!params.empty(), "no parameters to synchronise", "this is a bug");
  if (mode == GradSyncMode::kPerParam) {
    return std::make_unique<PerParamSync>(comm, params, reduce_dtype);
  }
  GPT2P_CHECK(bucket_mb > 0, "--bucket-mb " << bucket_mb << " is not positive",
              "pass a bucket size in MiB, e.g. 25");
  return std::make_unique<BucketedSync>(comm, params, bucket_mb, reduce_dtype, tied_embedding);
}

}  // namespace gpt2p::parallel
