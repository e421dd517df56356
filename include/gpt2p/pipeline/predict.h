// Predicted pipeline step times from per-layer costs: the simulator (simulator.h) run on a
// partition's stage costs. pp_plan prints these for measured layer times, so a user can pick the
// split, the schedule and M before spending GPU hours, and the benchmark can say how far a
// measured run is from what its costs allow.
#pragma once

#include <vector>

#include "gpt2p/pipeline/partition.h"
#include "gpt2p/pipeline/schedule.h"

namespace gpt2p::pipeline {

struct StepPrediction {
  double step = 0;                 // makespan of one step (forward + backward of every micro-batch)
  double bubble = 0;               // idle fraction of all stages over the step
  std::vector<double> stage_busy;  // per rank: compute time per step
};

// `layer_costs`: forward + backward cost of ONE micro-batch per layer (partition.h numbering), in
// any time unit. Each stage's forward takes `forward_share` of its cost, backward the rest (1/3:
// backward does about twice forward's matmul work). `comm` is added to every activation and
// gradient transfer. Transfers follow pp_train on GPUs (one stream per direction). m = 1 is
// model parallelism (pp_train --mode model_parallel) when `layer_costs` are the whole batch's.
// With stages_per_rank V > 1 (ScheduleKind::kInterleaved) the partition holds R * V stages on R
// ranks. Throws gpt2p::Error for costs that do not fit the partition, m < 1, a share outside
// (0, 1), or a partition that does not split into V stages per rank.
StepPrediction predict_step(ScheduleKind kind, int n_microbatches, const Partition& partition,
                            const std::vector<double>& layer_costs, double comm = 0.0,
                            double forward_share = 1.0 / 3.0, int stages_per_rank = 1);

}  // namespace gpt2p::pipeline
