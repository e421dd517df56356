// The hybrid search behind pp_plan --gpus G: for every D dividing G, D data-parallel replicas of a
// P = G / D rank pipeline (pp_train --dp D), each at the fastest plan (planner.h) for a replica's
// batch (global batch / D), plus a ring all-reduce of the busiest rank's gradients over the D
// replicas, 2 (D - 1) / D x bytes at the all-reduce bandwidth, which pp_train runs after the
// pipeline's step (not overlapped). Ranked by tokens per second of the whole job.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <vector>

#include "gpt2p/model/config.h"
#include "gpt2p/pipeline/perf/planner.h"

namespace gpt2p::pipeline {

// The spec of D = `dp` replicas of a P = gpus / dp pipeline: `spec` (the global batch) at the
// replica's batch, with the micro-batch counts of `spec` that divide it (1 when none does) and V =
// 1 alone where P = 1. `skip` says why the split has no plan ("" when it has one): a batch that
// does not split over the replicas, or why_no_plan's reason on n_layer blocks.
PlanSpec hybrid_spec(const PlanSpec& spec, int gpus, int dp, int64_t n_layer, std::string& skip);

// Why no D x P split of `gpus` GPUs has a plan, each split's reason joined by "; ", or "" when
// one has.
std::string why_no_hybrid_plan(const PlanSpec& spec, int gpus, int64_t n_layer);

// The fp32 gradient bytes the busiest rank of a split ("0-8|9-13", inclusive layers per stage;
// rank r holds stages r, r + ranks, ...) sums over its replicas: its stages' parameters, with the
// head stage's own copy of the tied wte.
double busiest_rank_gradient_bytes(const model::GPT2Config& config, const std::string& split,
                                   int ranks);

// One D x P split at its fastest pipeline plan.
struct HybridPick {
  int dp = 1, pp = 1;
  PlanRow row;                // the fastest row of the P-rank pipeline at the replica's batch
  double allreduce_s = 0;     // the replicas' gradient all-reduce (0 for D = 1)
  double step_s = 0;          // row.step_s + allreduce_s
  std::string eager_because;  // its plan's (Plan::eager_because): "" when timed as CUDA graphs
};

// A split of the GPUs that has no plan, and why (hybrid_spec's skip).
struct HybridSkip {
  int dp = 1, pp = 1;
  std::string why;
};

struct HybridPlan {
  int gpus = 0;
  double allreduce_gbs = 0;         // GB/s of the replicas' all-reduce (NCCL's bus bandwidth)
  std::vector<HybridSkip> skipped;  // in order of D
  std::vector<HybridPick> picks;    // fastest first
};

// Plans every D x P split of `gpus` GPUs (make_plan on hybrid_spec's spec, so the layers are
// timed again for each split; the step tail, which no split changes, once for all of them).
// Throws gpt2p::Error when no split gives a plan.
HybridPlan plan_hybrid(const model::GPT2Config& config, const PlanSpec& spec, int gpus,
                       double allreduce_gbs, const c10::Device& device);

}  // namespace gpt2p::pipeline
