#include "gpt2p/pipeline/perf/predict.h"

#include <algorithm>

#include "gpt2p/core/error.h"
#include "gpt2p/pipeline/plan/simulator.h"
#include "gpt2p/pipeline/plan/zero_bubble.h"

namespace gpt2p::pipeline {

StepPrediction predict_step(ScheduleKind kind, int n_microbatches, const Partition& partition,
                            const std::vector<double>& layer_costs, const StepModel& model) {
  const double comm = model.comm, forward_share = model.forward_share;
  const int stages_per_rank = model.stages_per_rank;
  GPT2P_CHECK(n_microbatches >= 1, "predict_step: " << n_microbatches << " micro-batches",
              "predict at least one micro-batch");
  GPT2P_CHECK(forward_share > 0.0 && forward_share < 1.0,
              "predict_step: forward_share " << forward_share << " is not in (0, 1)",
              "pass the forward's fraction of a layer's forward + backward cost (about 1/3)");
  GPT2P_CHECK(comm >= 0.0, "predict_step: transfer cost " << comm << " < 0",
              "pass a transfer time >= 0");
  GPT2P_CHECK(model.stage_overhead >= 0.0,
              "predict_step: stage overhead " << model.stage_overhead << " < 0",
              "pass a per-stage overhead >= 0");
  GPT2P_CHECK(model.block_weight_share >= 0.0 && model.block_weight_share < 1.0 - forward_share,
              "predict_step: block weight share " << model.block_weight_share
                                                  << " does not fit beside the forward's "
                                                  << forward_share,
              "pass the W part of a block's cost (zero_bubble.h's block_weight_share)");
  const std::vector<double> stage = stage_costs(layer_costs, partition);
  const int n_layers = static_cast<int>(layer_costs.size());
  SimCosts costs;
  for (size_t s = 0; s < stage.size(); ++s) {
    const double c = stage[s] + model.stage_overhead;
    double w = 0, blocks = 0;
    for (int layer = partition[s].begin; layer < partition[s].end; ++layer) {
      if (layer >= 1 && layer <= n_layers - 2) blocks += layer_costs[layer];
    }
    if (model.zero_bubble) w = model.block_weight_share * blocks;
    const double recompute =
        model.recompute == model::Recompute::kBlocks ? forward_share * blocks : 0.0;
    costs.forward.push_back(forward_share * c);
    costs.backward.push_back((1.0 - forward_share) * c - w + recompute);
    costs.weight.push_back(w);
  }
  costs.comm = comm;
  const int n_stages = static_cast<int>(partition.size());
  GPT2P_CHECK(stages_per_rank >= 1 && n_stages % stages_per_rank == 0,
              "predict_step: " << n_stages << " stages do not split into " << stages_per_rank
                               << " per rank",
              "pass a partition of ranks x stages_per_rank stages");
  const int n = n_stages / stages_per_rank;
  const auto schedule =
      model.zero_bubble ? make_zero_bubble_schedule(kind, n_microbatches, n, stages_per_rank,
                                                    ZeroBubbleCosts{costs.forward, costs.backward,
                                                                    costs.weight, costs.comm},
                                                    model.zb_extra_live)
                        : make_schedule(kind, n_microbatches, n, stages_per_rank);
  const SimResult sim = simulate(schedule, costs, Transfers::kStreamPerDirection);
  GPT2P_CHECK(
      model.stage_tail.empty() || model.stage_tail.size() == partition.size(),
      "predict_step: " << model.stage_tail.size() << " stage tails for " << n_stages << " stages",
      "pass one tail per stage of the partition, or none");
  std::vector<double> rank_tail(static_cast<size_t>(n), 0.0);
  for (size_t s = 0; s < model.stage_tail.size(); ++s) {
    GPT2P_CHECK(model.stage_tail[s] >= 0.0,
                "predict_step: stage " << s << "'s tail " << model.stage_tail[s] << " < 0",
                "pass tails >= 0");
    rank_tail[static_cast<size_t>(rank_of_stage(static_cast<int>(s), n))] += model.stage_tail[s];
  }
  const double tail = *std::max_element(rank_tail.begin(), rank_tail.end());
  GPT2P_CHECK(sim.ok,
              "predict_step: the " << to_string(kind) << " plan for m = " << n_microbatches
                                   << ", n = " << n << " deadlocks: " << sim.deadlock_reason,
              "report this: every schedule pp_train runs must simulate without deadlock");
  return {sim.makespan + tail,      tail,    sim.bubble_fraction, sim.busy,
          sim.max_live_activations, schedule};
}

}  // namespace gpt2p::pipeline
