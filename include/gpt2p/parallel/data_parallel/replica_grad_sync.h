// The gradients of a pipeline's stages between backward and the optimizer step: the sum over a
// stage's data-parallel replicas (pp_train --dp), the tied embedding's two halves (first and last
// stage) and the norm over every stage of every rank.
#pragma once

#include <memory>
#include <vector>

#include "gpt2p/comm/communicator.h"
#include "gpt2p/model/gpt2.h"
#include "gpt2p/parallel/data_parallel/grad_buckets.h"
#include "gpt2p/parallel/data_parallel/grad_sync.h"

namespace gpt2p::parallel {

// With --dp D: every gradient of one of this rank's stages summed over `replicas` (the D ranks
// holding this stage, one per replica), overlapped with the pipeline's last backwards: gradient
// buckets of about bucket_mb MiB (grad_buckets.h), armed right before the stage's last backward
// of the step (begin_backward(true) from GptStage::set_last_backward_hook), so each bucket is
// all-reduced as soon as that backward has produced its gradients. end_backward() after the
// schedule adds what no hook saw -- zero bubble's deferred weight gradients, which its W's add to
// .grad directly, often after the last backward; a stage no micro-batch reached is filled whole
// -- waits, and leaves every sum in .grad; all replicas then hold the same bits. Every rank of
// `replicas` builds it over the same stage. The buckets are a second copy of the stage's
// gradients (4 bytes per parameter).
class ReplicaGradSync final : public GradSync {
 public:
  ReplicaGradSync(const std::vector<torch::Tensor>& params, comm::Communicator& replicas,
                  double bucket_mb);
  void begin_backward(bool sync) override;
  void end_backward() override;
  SyncTimes finish_step() override { return {}; }  // timed as the step's exposed sync
  std::string name() const override { return "bucketed (sum over replicas)"; }

 private:
  comm::Communicator& replicas_;
  std::vector<comm::WorkPtr> works_;      // per bucket
  std::unique_ptr<GradBuckets> buckets_;  // last: its hooks use works_
};

// After backward on every rank: the first and the last stage each hold one part of the tied wte
// gradient (embedding and head); both end up with the sum, so the two copies stay equal after the
// optimizer step. `stages` are this rank's stages (one, or V when interleaved); only the ranks of
// the first and last stage exchange anything. A no-op on one rank. Every rank calls it.
void sync_tied_gradient(const std::vector<model::GPT2>& stages, comm::Communicator& comm);
// The same on other tensors: parts[c] holds stage c's part (undefined for a stage with neither
// end), e.g. ZeRO's shard of the tied weight's gradient (zero.h: alone_shard_grad), which the
// first and the last stage of a replica shard alike.
void sync_tied_gradient(const std::vector<model::GPT2>& stages, comm::Communicator& comm,
                        const std::vector<torch::Tensor>& parts);

// torch's clip_grad_norm_ over the parameters of all stages of all ranks together (the tied
// weight counted once); returns the global norm before clipping. Every rank calls it with its
// stages. comm may be null (1 rank). inv_scale: loss scaling's, as grad_norm.h.
double clip_grad_norm_pipeline(const std::vector<model::GPT2>& stages, comm::Communicator* comm,
                               double max_norm, double inv_scale = 1.0);

}  // namespace gpt2p::parallel
