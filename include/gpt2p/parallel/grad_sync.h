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
// With gradient accumulation only the last micro-step's backward synchronises (begin_backward(true));
// earlier ones just accumulate into .grad locally.
#pragma once

#include <torch/types.h>

#include <memory>
#include <string>
#include <vector>

#include "gpt2p/comm/communicator.h"

namespace gpt2p::parallel {

struct SyncTimes {
  double total = 0;    // seconds the reductions took, overlapped or not
  double exposed = 0;  // seconds end_backward() held the step beyond backward
};

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
};

// mode: "none" | "per-param" | "bucketed". `comm` may be null only for "none".
std::unique_ptr<GradSync> make_grad_sync(const std::string& mode, comm::Communicator* comm,
                                         const std::vector<torch::Tensor>& params,
                                         double bucket_mb, torch::ScalarType reduce_dtype);

}  // namespace gpt2p::parallel
