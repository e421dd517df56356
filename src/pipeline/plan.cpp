#include "gpt2p/pipeline/plan.h"

#include <algorithm>
#include <optional>

#include "gpt2p/core/error.h"
#include "gpt2p/pipeline/partition.h"
#include "gpt2p/pipeline/predict.h"

namespace gpt2p::pipeline {

Plan make_plan(const model::GPT2Config& config, const PlanSpec& spec, const c10::Device& device) {
  for (int m : spec.microbatches) {
    GPT2P_CHECK(m >= 1 && spec.batch_size % m == 0,
                "pp_plan: " << m << " micro-batches do not divide the batch of " << spec.batch_size,
                "drop it or change the batch");
  }
  const int L = static_cast<int>(config.n_layer);
  std::vector<int> counts = spec.microbatches;
  if (std::find(counts.begin(), counts.end(), 1) == counts.end()) counts.insert(counts.begin(), 1);
  Plan plan;
  std::map<int, std::vector<double>> costs;  // M -> per-layer costs of one micro-batch
  for (int m : counts) {
    const int64_t rows = spec.batch_size / m;
    const LayerTimes t =
        measure_layer_times(config, rows, spec.seq_len, spec.bf16, device, 2, spec.reps, 3);
    plan.times[rows] = t;
    costs[m] = layer_costs_from_times(t, L);
  }

  const auto flops = layer_costs_flops(
      L, static_cast<int>(config.n_embd), static_cast<int>(config.n_head),
      static_cast<int>(spec.seq_len), static_cast<int>(config.padded_vocab_size()));
  // Seconds to move one micro-batch's fp32 activations (or their gradient) between stages.
  const auto transfer = [&](int m) {
    return static_cast<double>(spec.batch_size / m * spec.seq_len * config.n_embd) * 4.0 /
           (spec.link_gbs * 1e9);
  };
  const int n = spec.stages;
  // uniform and balanced cut the same way for every M; measured cuts by that M's layer times.
  std::optional<Partition> uniform;
  try {
    uniform = partition_uniform(L, n);
  } catch (const Error& e) {
    plan.notes.push_back(std::string("no uniform split: ") + e.what());
  }
  const Partition balanced = partition_balanced(flops, n);
  for (const std::string partition : {"uniform", "balanced", "measured"}) {
    if (partition == "uniform" && !uniform) continue;
    for (int m : spec.microbatches) {
      const Partition split = partition == "uniform"    ? *uniform
                              : partition == "balanced" ? balanced
                                                        : partition_balanced(costs[m], n);
      // model_parallel on the same split: the whole batch as one micro-batch.
      const double mp = predict_step(ScheduleKind::kGPipe, 1, split, costs[1], transfer(1)).step;
      for (auto kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB}) {
        if (m == 1 && kind == ScheduleKind::kOneFOneB) continue;  // the same as GPipe
        const StepPrediction p = predict_step(kind, m, split, costs[m], transfer(m));
        plan.rows.push_back({partition, to_string(split),
                             m == 1 ? "model_parallel" : to_string(kind), m, p.step, mp / p.step,
                             n * static_cast<double>(m) / (m + n - 1), p.bubble, p.stage_busy});
      }
    }
  }
  return plan;
}

nlohmann::json to_json(const Plan& plan, int n_layer) {
  nlohmann::json costs = nlohmann::json::object();
  for (const auto& [rows, t] : plan.times)
    costs[std::to_string(rows)] = layer_costs_from_times(t, n_layer);
  nlohmann::json rows = nlohmann::json::array();
  for (const PlanRow& r : plan.rows) {
    rows.push_back({{"partition", r.partition},
                    {"split", r.split},
                    {"schedule", r.schedule},
                    {"microbatches", r.microbatches},
                    {"step_s", r.step_s},
                    {"speedup_vs_model_parallel", r.speedup},
                    {"ideal_speedup", r.ideal},
                    {"idle_fraction", r.idle},
                    {"stage_busy_s", r.stage_busy_s}});
  }
  return {{"layer_costs_s_by_rows", costs}, {"predictions", rows}};
}

}  // namespace gpt2p::pipeline
