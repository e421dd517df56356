#include "gpt2p/pipeline/perf/planner.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "gpt2p/compat/cuda_graph.h"
#include "gpt2p/core/error.h"
#include "gpt2p/model/gpt2.h"
#include "gpt2p/pipeline/perf/memory.h"
#include "gpt2p/pipeline/perf/predict.h"
#include "gpt2p/pipeline/plan/partition.h"
#include "gpt2p/pipeline/plan/zero_bubble.h"
#include "gpt2p/pipeline/runtime/graph_terms.h"

namespace gpt2p::pipeline {

Plan make_plan(const model::GPT2Config& config, const PlanSpec& spec, const c10::Device& device) {
  for (int m : spec.microbatches) {
    GPT2P_CHECK(m >= 1 && spec.batch_size % m == 0,
                "pp_plan: " << m << " micro-batches do not divide the batch of " << spec.batch_size,
                "drop it or change the batch");
  }
  GPT2P_CHECK(spec.replicas >= 1, "pp_plan: " << spec.replicas << " data-parallel replicas",
              "plan at least one replica");
  GPT2P_CHECK(spec.zero == 0 || spec.zero == 1, "pp_plan: --zero " << spec.zero,
              "pass 0 (no sharding) or 1 (AdamW's moments sharded over the replicas)");
  const int L = static_cast<int>(config.n_layer);
  std::vector<int> counts = spec.microbatches;
  if (std::find(counts.begin(), counts.end(), 1) == counts.end()) counts.insert(counts.begin(), 1);
  Plan plan;
  plan.eager_because = plan_graph_blocker(spec, device);
  std::map<int, std::vector<double>> costs;  // M -> per-layer costs of one micro-batch
  for (size_t i = 0; i < counts.size(); ++i) {
    const int m = counts[i];
    const int64_t rows = spec.batch_size / m;
    if (spec.progress) {
      spec.progress("timing the layers at micro-batches of " + std::to_string(rows) +
                    " rows (M = " + std::to_string(m) + ", " + std::to_string(i + 1) + " of " +
                    std::to_string(counts.size()) + ")");
    }
    LayerTiming timing;
    timing.reps = spec.reps;
    timing.loss_fraction = spec.loss_fraction;
    timing.kernels = spec.kernels;
    timing.graphs = plan.eager_because.empty();
    timing.microbatches = m;
    timing.positions = spec.loss_positions;
    const LayerTimes t = measure_layer_times(config, rows, spec.seq_len,
                                             model::autocast_type(spec.precision), device, timing);

    plan.times[rows] = t;
    costs[m] = layer_costs_from_times(t, L);
  }

  const auto flops = layer_costs_flops(
      L, static_cast<int>(config.n_embd), static_cast<int>(config.n_head),
      static_cast<int>(spec.seq_len), static_cast<int>(config.padded_vocab_size()),
      model::head_row_share(spec.loss_positions, spec.loss_fraction));
  // Seconds to move one micro-batch's fp32 activations (or their gradient) between stages.
  const auto transfer = [&](int m) {
    return static_cast<double>(spec.batch_size / m * spec.seq_len * config.n_embd) * 4.0 /
           (spec.link_gbs * 1e9);
  };
  const int n = spec.stages;
  // How a step of M micro-batches on V stages per rank costs beyond its layers: transfers, and
  // per stage and micro-batch what a forward + backward call costs (the profile's `stage`).
  const double weight_share =
      block_weight_share(static_cast<int>(config.n_embd), static_cast<int>(spec.seq_len));
  plan.tail = measure_plan_tail(config, spec, device);
  const auto step_model = [&](int m, int v, const Partition& stages, bool zb = false,
                              int extra_live = 0) {
    StepModel model;
    if (plan.tail.measured) {
      for (const LayerRange& stage : stages) {
        model.stage_tail.push_back(plan.tail.fixed +
                                   plan.tail.per_parameter * stage_parameters(config, stage));
      }
    }
    model.comm = transfer(m);
    model.stages_per_rank = v;
    model.stage_overhead = plan.times.at(spec.batch_size / m).stage;
    model.zero_bubble = zb;
    model.block_weight_share = zb ? weight_share : 0.0;
    model.zb_extra_live = extra_live;
    model.recompute = spec.recompute;
    return model;
  };
  const MemoryModel memory{spec.recompute, spec.replicas, spec.zero == 1};
  for (int v : spec.stages_per_rank) {
    GPT2P_CHECK(v >= 1, "pp_plan: " << v << " stages per rank", "use 1 or more stages per rank");
  }
  for (int k : spec.zb_extra_live) {
    GPT2P_CHECK(k >= 0 || k == kNoLiveLimit, "pp_plan: zero-bubble extra live micro-batches " << k,
                "use 0 or more, or " << kNoLiveLimit << " for no limit");
  }
  // The variants predicted per pipeline row: unsplit, then each zero-bubble memory allowance.
  std::vector<std::optional<int>> variants{std::nullopt};
  if (spec.zero_bubble) {
    for (int k : spec.zb_extra_live) variants.emplace_back(k);
  }
  // The split of each partition into n x v stages: uniform and balanced cut the same way for
  // every M, measured by that M's layer times. Splits that cannot be made give a note and no rows.
  // With v stages per rank, balanced and measured balance the ranks' loads.
  std::map<std::pair<PartitionKind, int>, std::optional<Partition>> fixed;
  const auto split_of = [&](PartitionKind partition, int v, int m) -> std::optional<Partition> {
    if (partition == PartitionKind::kMeasured) return partition_interleaved(costs[m], n, v);
    auto key = std::make_pair(partition, v);
    auto it = fixed.find(key);
    if (it != fixed.end()) return it->second;
    std::optional<Partition> split;
    try {
      split = partition == PartitionKind::kUniform ? partition_uniform(L, n * v)
                                                   : partition_interleaved(flops, n, v);
    } catch (const Error& e) {
      plan.notes.push_back("no " + name_string(partition) + " split into " + std::to_string(n * v) +
                           " stages: " + e.what());
    }
    return fixed[key] = split;
  };
  for (const auto& named : names(PartitionKind{})) {
    const PartitionKind partition = named.value;
    for (int m : spec.microbatches) {
      const auto split = split_of(partition, 1, m);
      if (!split) continue;
      // model_parallel on the same split: the whole batch as one micro-batch.
      const double mp =
          predict_step(ScheduleKind::kGPipe, 1, *split, costs[1], step_model(1, 1, *split)).step;
      const auto add = [&](ScheduleKind kind, int v, const Partition& stages) {
        for (const std::optional<int>& zb : variants) {
          if (zb && m == 1) continue;
          const StepPrediction p = predict_step(
              kind, m, stages, costs[m], step_model(m, v, stages, zb.has_value(), zb.value_or(0)));
          const double mv = static_cast<double>(m) * v;
          const double bubble = (n - 1) * (zb ? 1.0 - 2.0 * weight_share : 1.0);
          const ActivationBytes& kept = plan.times.at(spec.batch_size / m).activations;
          PlanRow row{partition,
                      to_string(stages),
                      m == 1 ? "model_parallel" : to_string(kind),
                      v,
                      zb.has_value(),
                      zb.value_or(0),
                      m,
                      p.step,
                      mp / p.step,
                      n * mv / (mv + bubble),
                      p.bubble,
                      p.stage_busy,
                      {},
                      kept.measured};
          for (const RankMemory& r : predict_memory(config, stages, p.schedule, kept, memory))
            row.peak_memory_bytes.push_back(r.total());
          plan.rows.push_back(std::move(row));
        }
      };
      for (int v : spec.stages_per_rank) {
        // Several stages per rank take 2 ranks or more, M a multiple of them, a block per stage.
        const bool several = v != 1;
        if (several && (n < 2 || m % n != 0 || n * v > L)) continue;
        const auto stages = several ? split_of(partition, v, m) : split;
        if (!stages) continue;
        for (const ScheduleInfo& schedule : kSchedules) {
          if (schedule.several_stages_per_rank != several) continue;
          add(schedule.kind, v, *stages);
          if (m == 1) break;  // M = 1: every schedule runs the same (model_parallel)
        }
      }
    }
  }
  return plan;
}

StepTail measure_plan_tail(const model::GPT2Config& config, const PlanSpec& spec,
                           const c10::Device& device) {
  if (spec.tail.measured || !spec.step_tail) return spec.tail;
  if (spec.progress) spec.progress("timing the step after the schedule (norm, AdamW, zeroing)");
  return measure_step_tail(config, spec.seq_len, model::autocast_type(spec.precision), device,
                           spec.kernels, spec.step_tail, spec.reps, 3);
}

std::string plan_graph_blocker(const PlanSpec& spec, const c10::Device& device) {
  return graph_blocker(plan_graph_terms(spec, device));
}

GraphTerms plan_graph_terms(const PlanSpec& spec, const c10::Device& device) {
  GraphTerms terms;
  terms.requested = spec.cuda_graphs;
  terms.gpu = device.is_cuda();
  terms.every_position = model::head_row_share(spec.loss_positions, spec.loss_fraction) >= 1.0;
  terms.recompute = spec.recompute != model::Recompute::kNone;
  terms.zero_bubble = spec.zero_bubble;
  terms.replicas = spec.replicas;
  return terms;
}

std::string why_no_plan(const PlanSpec& spec, int64_t n_layer) {
  const int n = spec.stages;
  if (n > n_layer) {
    return std::to_string(n) + " pipeline ranks but the model has only " + std::to_string(n_layer) +
           " blocks (every stage needs one)";
  }
  std::string why;
  for (int v : spec.stages_per_rank) {
    if (v == 1) return "";  // gpipe and 1f1b on any split into n <= n_layer stages
    std::string reason = "V=" + std::to_string(v) + " stages per rank ";
    const bool any_m = std::any_of(spec.microbatches.begin(), spec.microbatches.end(),
                                   [n](int m) { return m % n == 0; });
    if (n < 2) {
      reason += "(interleaved 1F1B) needs P >= 2 pipeline ranks, not " + std::to_string(n);
    } else if (static_cast<int64_t>(n) * v > n_layer) {
      reason += "needs n_layer >= P x V = " + std::to_string(static_cast<int64_t>(n) * v) +
                ", the model has " + std::to_string(n_layer);
    } else if (!any_m) {
      reason += "needs a micro-batch count M that is a multiple of P = " + std::to_string(n);
    } else {
      return "";
    }
    why += (why.empty() ? "" : "; ") + reason;
  }
  return why;
}

nlohmann::json to_json(const Plan& plan, int n_layer) {
  nlohmann::json costs = nlohmann::json::object(), overheads = nlohmann::json::object(),
                 kept = nlohmann::json::object();
  for (const auto& [rows, t] : plan.times) {
    costs[std::to_string(rows)] = layer_costs_from_times(t, n_layer);
    overheads[std::to_string(rows)] = t.stage;
    const ActivationBytes& a = t.activations;
    kept[std::to_string(rows)] = {{"embedding", a.embedding},
                                  {"block", a.block},
                                  {"block_recompute", a.block_recompute},
                                  {"head", a.head},
                                  {"stage_input", a.stage_input},
                                  {"measured", a.measured}};
  }
  nlohmann::json rows = nlohmann::json::array();
  for (const PlanRow& r : plan.rows) {
    rows.push_back({{"partition", name_string(r.partition)},
                    {"split", r.split},
                    {"schedule", r.schedule},
                    {"stages_per_rank", r.stages_per_rank},
                    {"zero_bubble", r.zero_bubble},
                    {"zb_extra_live", r.zb_extra_live},
                    {"microbatches", r.microbatches},
                    {"step_s", r.step_s},
                    {"speedup_vs_model_parallel", r.speedup},
                    {"ideal_speedup", r.ideal},
                    {"idle_fraction", r.idle},
                    {"stage_busy_s", r.stage_busy_s},
                    {"peak_memory_bytes", r.peak_memory_bytes},
                    {"peak_memory_measured", r.peak_memory_measured}});
  }
  nlohmann::json tail = nullptr;  // not measured: the predictions are the schedule's alone
  if (plan.tail.measured) {
    tail = {{"fixed_s", plan.tail.fixed}, {"per_parameter_s", plan.tail.per_parameter}};
  }
  return {{"layer_costs_s_by_rows", costs},
          {"stage_overhead_s_by_rows", overheads},
          {"step_tail", tail},
          {"activation_bytes_by_rows", kept},
          {"predictions", rows}};
}

}  // namespace gpt2p::pipeline
