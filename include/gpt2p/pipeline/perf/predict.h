// Predicted pipeline step times from per-layer costs: the simulator (simulator.h) run on a
// partition's stage costs. pp_plan prints these for measured layer times, so a user can pick the
// split, the schedule and M before spending GPU hours, and the benchmark can say how far a
// measured run is from what its costs allow.
#pragma once

#include <vector>

#include "gpt2p/model/options.h"
#include "gpt2p/pipeline/plan/partition.h"
#include "gpt2p/pipeline/plan/schedule.h"

namespace gpt2p::pipeline {

struct StepPrediction {
  // One step: the schedule's makespan (forward + backward of every micro-batch), then `tail`.
  double step = 0;
  double tail = 0;                 // the slowest rank's work after the schedule (StepModel)
  double bubble = 0;               // idle fraction of all stages over the schedule
  std::vector<double> stage_busy;  // per rank: compute time per step
  // Per rank: the most micro-batches whose activations it holds at once (simulator.h).
  std::vector<int> max_live_activations;
  Schedule schedule;  // what was simulated, with communication (memory.h weighs its live F's)
};

// What a step costs besides the layers, and how it splits (all times in layer_costs' unit).
struct StepModel {
  double comm = 0.0;                 // added to every activation and gradient transfer
  double forward_share = 1.0 / 3.0;  // of a stage's cost; backward the rest (twice the matmuls)
  int stages_per_rank = 1;           // V > 1: ScheduleKind::kInterleaved on R * V stages
  double stage_overhead = 0.0;       // per stage and micro-batch, beyond its layers
  // Zero bubble (zero_bubble.h): split backwards, the W's placed by zero_bubble_schedule. A block
  // layer's W is block_weight_share of its cost (zero_bubble.h: block_weight_share); other layers
  // (embedding, head) have none.
  bool zero_bubble = false;
  double block_weight_share = 0.0;
  int zb_extra_live = 0;  // zero_bubble_schedule's extra_live (0: the base's memory)
  // kBlocks (pp_train --recompute blocks): every backward first runs its blocks' forward again,
  // forward_share of each block layer's cost, added to the stage's B.
  model::Recompute recompute = model::Recompute::kNone;
  // Per stage (the partition's order): its work after the schedule (pp_train: the gradient norm
  // and clip, AdamW, zeroing .grad). Each rank runs its stages' one after another once its
  // schedule ends, and the step ends with the slowest rank's. Empty: none.
  std::vector<double> stage_tail{};
};

// `layer_costs`: forward + backward cost of ONE micro-batch per layer (partition.h numbering), in
// any time unit; a stage costs the sum of its layers plus model.stage_overhead (what one forward +
// backward call costs whatever its layers: layer_profile.h's LayerTimes::stage). Transfers follow
// pp_train on GPUs (one stream per channel). m = 1 is model parallelism (pp_train --mode
// model_parallel) when `layer_costs` are the whole batch's. With stages_per_rank V > 1 the
// partition holds R * V stages on R ranks. Throws gpt2p::Error for costs that do not fit the
// partition, m < 1, a share outside (0, 1), a negative comm or overhead, or a partition that does
// not split into V stages per rank, or a stage_tail that is neither empty nor one time >= 0 per
// stage.
StepPrediction predict_step(ScheduleKind kind, int n_microbatches, const Partition& partition,
                            const std::vector<double>& layer_costs, const StepModel& model = {});

}  // namespace gpt2p::pipeline
