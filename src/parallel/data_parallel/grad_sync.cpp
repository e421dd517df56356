#include "gpt2p/parallel/data_parallel/grad_sync.h"

#include <algorithm>
#include <chrono>

#include "gpt2p/core/error.h"
#include "gpt2p/parallel/data_parallel/grad_buckets.h"

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
  bool capturable() const override { return true; }
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

// Buckets filled by autograd hooks (grad_buckets.h), each reduced asynchronously as soon as it is
// complete.
class BucketedSync final : public GradSync {
 public:
  BucketedSync(comm::Communicator* comm, const std::vector<torch::Tensor>& params, double bucket_mb,
               torch::ScalarType dtype, torch::Tensor tied)
      : comm_(comm),
        tied_(std::move(tied)),
        lookups_(comm, dtype),
        buckets_(params, bucket_options(bucket_mb, dtype), [this](size_t b) { launch(b); }) {
    if (tied_.defined()) {
      GPT2P_CHECK(std::any_of(params.begin(), params.end(),
                              [&](const torch::Tensor& p) { return p.is_same(tied_); }),
                  "the tied embedding weight is not among the parameters to synchronise",
                  "pass the model's own wte weight");
    }
    works_.resize(buckets_.buckets().size());
  }

  void begin_backward(bool sync) override {
    buckets_.arm(sync);
    if (!sync) return;
    for (auto& w : works_) w.reset();
    first_launch_ = Clock::time_point{};
  }

  EmbeddingGradSink embedding_sink() override {
    if (!tied_.defined()) return {};
    return [this](const torch::Tensor& ids, const torch::Tensor& grad) {
      lookups_.add(ids, grad, buckets_.armed());
    };
  }

  void end_backward() override {
    if (!buckets_.armed()) return;
    backward_end_ = Clock::now();
    buckets_.finish_backward();
    for (size_t bi = 0; bi < works_.size(); ++bi) {
      works_[bi]->wait();
      auto& flat = buckets_.flat(bi);
      for (size_t s : buckets_.buckets()[bi].slots) {
        auto& param = buckets_.slots()[s].param;
        auto& g = param.mutable_grad();
        auto avg = buckets_.view(flat, s);
        // The bucket already holds any earlier .grad: the average replaces it.
        if (avg.scalar_type() == param.scalar_type()) {
          g = avg;
        } else if (!g.defined()) {
          g = avg.to(param.scalar_type());
        } else {
          g.copy_(avg);
        }
      }
    }
    // The tied weight's .grad holds the averaged head part; add the lookup's part of the global
    // batch, divided by the ranks as the average would.
    if (lookups_.gathering()) {
      auto part = lookups_.dense(tied_.size(0), tied_.scalar_type());
      const double inv = 1.0 / static_cast<double>(comm_->size());
      auto& g = tied_.mutable_grad();
      if (g.defined()) {
        g.add_(part, inv);
      } else {
        g = part.mul_(inv);
      }
    }
    synced_ = true;
  }

  SyncTimes finish_step() override {
    if (!synced_) return {};
    synced_ = false;
    for (auto& w : works_) w->synchronize();
    return sync_times(first_launch_, backward_end_, Clock::now());
  }

  std::string name() const override { return "bucketed"; }

 private:
  static BucketOptions bucket_options(double bucket_mb, torch::ScalarType dtype) {
    BucketOptions o;
    o.bucket_mb = bucket_mb;
    o.dtype = dtype;
    return o;
  }

  void launch(size_t bi) {
    if (first_launch_ == Clock::time_point{}) first_launch_ = Clock::now();
    works_[bi] = comm_->all_reduce_async(buckets_.flat(bi), comm::ReduceOp::kAvg);
  }

  comm::Communicator* comm_;
  torch::Tensor tied_;  // reduced sparsely when defined
  LookupGrads lookups_;
  std::vector<comm::WorkPtr> works_;
  GradBuckets buckets_;  // last: its hooks call launch(), which uses the members above
  bool synced_ = false;
  Clock::time_point first_launch_{}, backward_end_{};
};

}  // namespace

SyncTimes sync_times(Clock::time_point first_launch, Clock::time_point backward_end,
                     Clock::time_point done) {
  const auto start = first_launch == Clock::time_point{} ? backward_end : first_launch;
  SyncTimes t;
  t.total = std::chrono::duration<double>(done - start).count();
  t.exposed = std::chrono::duration<double>(done - backward_end).count();
  return t;
}

std::unique_ptr<GradSync> make_no_sync() { return std::make_unique<NoSync>(); }

std::unique_ptr<GradSync> make_grad_sync(GradSyncMode mode, comm::Communicator* comm,
                                         const std::vector<torch::Tensor>& params, double bucket_mb,
                                         torch::ScalarType reduce_dtype,
                                         const torch::Tensor& tied_embedding) {
  GPT2P_CHECK(comm != nullptr, "gradient sync '" << name_of(mode) << "' needs a communicator",
              "this is a bug");
  GPT2P_CHECK(!params.empty(), "no parameters to synchronise", "this is a bug");
  if (mode == GradSyncMode::kPerParam) {
    return std::make_unique<PerParamSync>(comm, params, reduce_dtype);
  }
  return std::make_unique<BucketedSync>(comm, params, bucket_mb, reduce_dtype, tied_embedding);
}

}  // namespace gpt2p::parallel
