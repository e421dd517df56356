// Gradient buckets: the parameters laid out in flat buffers, filled by autograd hooks as backward
// produces each gradient, with a callback as soon as a bucket is complete. The data-parallel
// syncs build on it: BucketedSync all-reduces each bucket (grad_sync.h), ZeRO-1 reduce-scatters it
// (zero.h), both while the rest of backward runs.
//
// Layout: parameters in reverse registration order (the order backward produces them), a new
// bucket when the next one would pass the capacity. Within a bucket each parameter starts at a
// multiple of `align` elements and the bucket's size is a multiple of `parts` x `align`, so that
// it splits into `parts` equal, aligned shards (ZeRO's per-rank parts; align 1 and parts 1 pack
// tightly). A parameter named `alone` gets a bucket of its own, the first.
//
// With gradient accumulation only the syncing backward is armed (arm(true)); a hook then copies
// .grad (earlier micro-steps) + this backward's gradient into the bucket. Hooks run on autograd's
// thread, in backward order; every parameter's hook runs at most once per armed backward.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "gpt2p/comm/communicator.h"

namespace gpt2p::parallel {

struct BucketOptions {
  double bucket_mb = 25;  // capacity in MiB of `dtype`
  torch::ScalarType dtype = torch::kFloat32;
  int64_t align = 1;
  int parts = 1;
  torch::Tensor alone;  // undefined: none
};

class GradBuckets {
 public:
  struct Slot {
    torch::Tensor param;
    size_t bucket = 0;
    int64_t offset = 0;  // elements into the bucket
    bool filled = false;
    unsigned hook = 0;
  };
  struct Bucket {
    std::vector<size_t> slots;
    int64_t numel = 0;  // padded to parts x align
    int64_t pending = 0;
    bool launched = false;
    torch::Tensor flat;  // [numel] of the options' dtype, on the parameters' device
  };
  // on_ready(b): bucket b holds every gradient of this backward (called once per armed backward).
  using Ready = std::function<void(size_t bucket)>;

  // `hooks` false: no autograd hooks; fill_all() copies every .grad after backward instead.
  GradBuckets(const std::vector<torch::Tensor>& params, const BucketOptions& options,
              Ready on_ready, bool hooks = true);
  ~GradBuckets();
  GradBuckets(const GradBuckets&) = delete;
  GradBuckets& operator=(const GradBuckets&) = delete;

  // Before a backward: `sync` = fill the buckets during it. A .grad still viewing its bucket from
  // the last step gets its own memory, or backward would accumulate into a bucket being reduced.
  void arm(bool sync);
  bool armed() const { return armed_; }
  // After an armed backward: buckets whose parameters got no gradient (unused ones) are filled
  // with .grad or zeros and made ready; then disarms.
  void finish_backward();
  // Without hooks: arm, copy every parameter's .grad into its bucket, make each ready in order.
  void fill_all();

  const std::vector<Bucket>& buckets() const { return buckets_; }
  const std::vector<Slot>& slots() const { return slots_; }
  torch::Tensor& flat(size_t bucket) { return buckets_[bucket].flat; }
  // Slot s's part of bucket `flat` (a [numel] tensor of the same layout), shaped as its parameter.
  torch::Tensor view(const torch::Tensor& flat, size_t s) const;
  // Elements of every bucket together.
  int64_t total_numel() const;

 private:
  void on_grad(size_t s, const torch::Tensor& grad);
  void fill(size_t s, const torch::Tensor& grad);
  void ready(size_t bucket);

  std::vector<Slot> slots_;
  std::vector<Bucket> buckets_;
  Ready on_ready_;
  bool hooks_;
  bool armed_ = false;
};

// The token lookup's share of the tied embedding's gradient, as data parallelism's sparse sync
// moves it (grad_sync.h): the B*T rows of every micro-step are kept, and at the syncing backward
// every rank's are all-gathered. dense() then sums them into a [rows, C] gradient, the same on
// every rank (from the same gathered rows).
class LookupGrads {
 public:
  LookupGrads(comm::Communicator* comm, torch::ScalarType dtype) : comm_(comm), dtype_(dtype) {}
  // One micro-step's ids [B,T] and output gradients [B,T,C]; `gather`: the last of the step.
  void add(const torch::Tensor& ids, const torch::Tensor& grad, bool gather);
  bool gathering() const { return grads_work_ != nullptr; }
  // Waits for the gathers; the embedding backward of every rank's rows, [rows, C] in `dtype`.
  torch::Tensor dense(int64_t rows, torch::ScalarType dtype);

 private:
  comm::Communicator* comm_;
  torch::ScalarType dtype_;
  std::vector<torch::Tensor> ids_, grads_;
  torch::Tensor gather_ids_, gather_grads_, ids_all_, grads_all_;
  comm::WorkPtr ids_work_, grads_work_;
};

}  // namespace gpt2p::parallel
