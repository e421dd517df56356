// Gradient synchronisation for data parallelism: after backward, every rank's gradients become
// the average over ranks.
//
//  * none       one rank: nothing to do.
//  * per-param  HW5's average_gradients: one all_reduce(avg) per parameter after backward.
//  * bucketed   gradients packed into buckets of --bucket-mb, in reverse registration order (the
//               order backward produces them). An autograd hook on each parameter copies its
//               gradient into its bucket; the bucket's async all_reduce starts as soon as all its
//               gradients are in, overlapping the rest of backward. end_backward() waits on all
//               buckets and copies the averages back into .grad. Optionally the buckets travel
//               in bf16 (--reduce-dtype bf16).
//               Once reduced, .grad is a view of its bucket (no copy back) unless the dtypes
//               differ.
// With gradient accumulation only the last micro-step's backward synchronises
// (begin_backward(true)); earlier ones just accumulate into .grad locally.
//
// The tied embedding / head weight (bucketed only, when make_grad_sync is given it): its gradient
// has a dense part from the head, ready right after the loss, and a sparse part from the token
// lookup, ready only when backward ends. Reduced as one 50k x C tensor it is the last and largest
// reduction, exposed after backward. Instead the model hands the lookup's gradient to
// embedding_sink() (GPT2Impl::set_embedding_grad_sink): the head's part then goes in its bucket as
// soon as backward starts, and the lookup's ids and output gradients (B*T rows, not 50k) are
// all-gathered; end_backward() adds embedding_backward(all rows) / ranks to the averaged head part.
// Every rank computes that sum from the same gathered rows, so ranks stay bitwise identical. It
// needs every rank's lookups to have the same shape (dp_train's [B/N, T] batches).
#pragma once

#include <torch/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gpt2p/comm/communicator.h"
#include "gpt2p/parallel/data_parallel/sync_options.h"

namespace gpt2p::parallel {

struct SyncTimes {
  double total = 0;    // seconds the reductions took, overlapped or not
  double exposed = 0;  // seconds end_backward() held the step beyond backward
};

// A step's reduction times, measured on the host up to `done`: total from the first launch (or
// from backward's end when nothing was launched before it), exposed from backward's end.
SyncTimes sync_times(std::chrono::steady_clock::time_point first_launch,
                     std::chrono::steady_clock::time_point backward_end,
                     std::chrono::steady_clock::time_point done);

class GradSync {
 public:
  virtual ~GradSync() = default;
  // Before a micro-step's backward: `sync` = this backward ends the step (average after it).
  virtual void begin_backward(bool sync) = 0;
  // After backward: when syncing, every .grad holds the average on return (NCCL: torch's current
  // stream is ordered after the reductions; the host has not waited).
  virtual void end_backward() = 0;
  // Blocks the host until the last step's reductions are done (with the communicator's timeout),
  // and returns their times. Call once per step, when the step is being timed anyway.
  virtual SyncTimes finish_step() = 0;
  virtual std::string name() const = 0;
  // Whether begin_backward .. end_backward can run inside a CUDA graph's capture: no
  // communication, no host wait (one rank's sync, which does nothing).
  virtual bool capturable() const { return false; }
  // What to pass to GPT2Impl::set_embedding_grad_sink, or an empty function when the tied weight
  // is reduced densely.
  using EmbeddingGradSink =
      std::function<void(const torch::Tensor& ids, const torch::Tensor& grad)>;
  virtual EmbeddingGradSink embedding_sink() { return {}; }
};

// One rank: gradients stay as backward left them.
std::unique_ptr<GradSync> make_no_sync();

// The sync of --grad-sync `mode` over `comm` (not null). `tied_embedding`: the tied weight (one of
// `params`) to reduce sparsely as above, or undefined for dense; only bucketed mode uses it.
std::unique_ptr<GradSync> make_grad_sync(GradSyncMode mode, comm::Communicator* comm,
                                         const std::vector<torch::Tensor>& params, double bucket_mb,
                                         torch::ScalarType reduce_dtype,
                                         const torch::Tensor& tied_embedding = {});

}  // namespace gpt2p::parallel
