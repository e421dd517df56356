#include "gpt2p/pipeline/perf/plan_report.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "gpt2p/pipeline/perf/hybrid.h"
#include "gpt2p/pipeline/perf/memory.h"
#include "gpt2p/pipeline/perf/planner.h"

namespace gpt2p::pipeline {

namespace {

// "+zb" for a zero-bubble row at the base schedule's memory, "+zb+K" with K extra live
// micro-batches, "+zb+inf" without a limit; "" for the rest.
std::string zb_tag(const PlanRow& r) {
  if (!r.zero_bubble) return "";
  if (r.zb_extra_live == 0) return "+zb";
  return r.zb_extra_live < 0 ? "+zb+inf" : "+zb+" + std::to_string(r.zb_extra_live);
}

// The busiest rank's predicted peak memory in GiB.
double peak_gib(const PlanRow& r) {
  const auto& bytes = r.peak_memory_bytes;
  if (bytes.empty()) return 0.0;
  return *std::max_element(bytes.begin(), bytes.end()) / (1024.0 * 1024 * 1024);
}

// " --recompute blocks" when the plan recomputes, "" otherwise.
std::string recompute_flag(const PlanSpec& spec) {
  return spec.recompute == model::Recompute::kNone ? ""
                                                   : " --recompute " + name_string(spec.recompute);
}

// The comment line above a table: what its peak_GiB column holds and where it comes from.
std::string memory_note(const PlanSpec& spec, const PlanRow& r) {
  return std::string("# peak_GiB: the busiest rank's weights, gradients, AdamW moments") +
         (spec.zero == 1 ? " (--zero 1: / D)" : "") + " and live activations (--recompute " +
         name_string(spec.recompute) + "), " +
         (r.peak_memory_measured ? "measured per layer by the CUDA allocator"
                                 : "estimated from the shapes (no allocator statistics here)");
}

}  // namespace

void print_plan(std::FILE* out, const Plan& plan, const PlanSpec& spec,
                const model::GPT2Config& config, const std::string& device) {
  std::fprintf(
      out,
      "# pp_plan: %s, %d stage(s), batch %lld x %lld, %s on %s, %s kernels, loss at %.3f of "
      "positions, head at %s\n",
      model::describe(config).c_str(), spec.stages, static_cast<long long>(spec.batch_size),
      static_cast<long long>(spec.seq_len), name_string(spec.precision).c_str(), device.c_str(),
      name_string(spec.kernels).c_str(), spec.loss_fraction,
      spec.loss_positions == model::LossPositions::kAll ? "every position (--loss-positions all)"
                                                        : "those positions");
  std::fprintf(out, "# layer times, ms per micro-batch (forward + backward), %s\n",
               plan.eager_because.empty()
                   ? "as CUDA graphs (as pp_train --cuda-graphs auto runs this plan)"
                   : ("launched eagerly: " + plan.eager_because).c_str());
  std::fprintf(out, "# (stage: what a stage's forward + backward call costs beyond its layers)\n");
  std::fprintf(out, "# %6s %10s %10s %10s %11s %10s\n", "rows", "embedding", "block", "head",
               "head/block", "stage");
  for (auto it = plan.times.rbegin(); it != plan.times.rend(); ++it) {
    const auto& t = it->second;
    std::fprintf(out, "# %6lld %10.3f %10.3f %10.3f %11.2f %10.3f\n",
                 static_cast<long long>(it->first), 1e3 * t.embedding, 1e3 * t.block, 1e3 * t.head,
                 t.head / t.block, 1e3 * t.stage);
  }
  if (plan.tail.measured) {
    // The whole model on one stage, as the largest a stage can be.
    const double all = stage_parameters(config, {0, static_cast<int>(config.num_stage_layers())});
    std::fprintf(out,
                 "# after the schedule, once per step and stage (gradient norm and clip, AdamW, "
                 "zeroing .grad): %.3f ms + %.3f ms per 10M parameters (%.3f ms for the whole "
                 "model), in every step_ms below\n",
                 1e3 * plan.tail.fixed, 1e3 * 1e7 * plan.tail.per_parameter,
                 1e3 * (plan.tail.fixed + plan.tail.per_parameter * all));
  } else {
    std::fprintf(out, "# step_ms below: the schedule alone (the step after it is not timed)\n");
  }
  for (const auto& note : plan.notes) std::fprintf(out, "# %s\n", note.c_str());
  if (!plan.rows.empty()) std::fprintf(out, "%s\n", memory_note(spec, plan.rows.front()).c_str());
  std::fprintf(out, "%-9s %-24s %-18s %2s %4s %5s %10s %8s %7s %7s %9s\n", "partition", "split",
               "schedule", "V", "M", "rows", "step_ms", "speedup", "ideal", "idle", "peak_GiB");
  for (const auto& r : plan.rows) {
    const std::string schedule = r.schedule == "model_parallel" ? "mp" : r.schedule + zb_tag(r);
    std::fprintf(out, "%-9s %-24s %-18s %2d %4d %5lld %10.3f %7.2fx %6.2fx %6.1f%% %9.3f\n",
                 name_string(r.partition).c_str(), r.split.c_str(), schedule.c_str(),
                 r.stages_per_rank, r.microbatches,
                 static_cast<long long>(spec.batch_size / r.microbatches), 1e3 * r.step_s,
                 r.speedup, r.ideal, 100.0 * r.idle, peak_gib(r));
  }
  // A pipeline of P stages is at most P times as fast as model parallelism, which runs the same
  // stages one after another: a prediction above that comes from layer times that are cheaper per
  // row at small micro-batches (caches, on a CPU), not from the schedule.
  for (const auto& r : plan.rows) {
    if (r.schedule == "model_parallel" || r.speedup <= spec.stages * 1.05) continue;
    std::fprintf(
        out,
        "# warning: a predicted speed-up (%.2fx, %s M=%d) exceeds the %d stages' bound of %dx: the "
        "layer times per row fall at small micro-batches on %s, so the speed-ups here overstate "
        "what pp_train gets; time the plan on the device that trains\n",
        r.speedup, r.schedule.c_str(), r.microbatches, spec.stages, spec.stages, device.c_str());
    break;
  }
  // The fastest pipeline plan (the model_parallel rows are the baseline).
  const PlanRow* best = nullptr;
  for (const auto& r : plan.rows) {
    if (r.schedule != "model_parallel" && (best == nullptr || r.step_s < best->step_s)) best = &r;
  }
  if (best != nullptr) {
    const std::string extra =
        (best->stages_per_rank > 1 ? " --stages-per-rank " + std::to_string(best->stages_per_rank)
                                   : std::string()) +
        (best->zero_bubble ? " --zero-bubble" : "") +
        (best->zero_bubble && best->zb_extra_live != 0
             ? " --zb-extra-live " + std::to_string(best->zb_extra_live)
             : std::string()) +
        recompute_flag(spec);
    std::fprintf(out,
                 "# fastest: pp_train --partition %s --schedule %s%s --microbatches %d: %.3f ms, "
                 "%.2fx model_parallel\n",
                 name_string(best->partition).c_str(), best->schedule.c_str(), extra.c_str(),
                 best->microbatches, 1e3 * best->step_s, best->speedup);
  }
}

nlohmann::json plan_document(const Plan& plan, const PlanSpec& spec,
                             const model::GPT2Config& config, const std::string& device) {
  nlohmann::json doc = to_json(plan, static_cast<int>(config.n_layer));
  doc.update({{"program", "pp_plan"},
              {"model", model::describe(config)},
              {"stages", spec.stages},
              {"batch_size", spec.batch_size},
              {"seq_len", spec.seq_len},
              {"precision", name_string(spec.precision)},
              {"kernels", name_string(spec.kernels)},
              {"layers_timed_as", plan.eager_because.empty() ? "cuda_graphs" : "eager"},
              {"layers_eager_because", plan.eager_because},
              {"device", device},
              {"link_gbs", spec.link_gbs},
              {"loss_fraction", spec.loss_fraction},
              {"loss_positions", name_string(spec.loss_positions)},
              {"recompute", name_string(spec.recompute)},
              {"zero", spec.zero}});
  return doc;
}

void print_hybrid_header(std::FILE* out, int gpus, const PlanSpec& spec) {
  std::fprintf(out,
               "# hybrid: %d GPU(s) as D replicas x P pipeline ranks, global batch %lld x %lld, %s "
               "kernels\n",
               gpus, static_cast<long long>(spec.batch_size), static_cast<long long>(spec.seq_len),
               name_string(spec.kernels).c_str());
}

void print_hybrid(std::FILE* out, const HybridPlan& hybrid, const PlanSpec& spec) {
  for (const HybridSkip& s : hybrid.skipped) {
    std::fprintf(out, "# D=%d x P=%d: skipped (%s)\n", s.dp, s.pp, s.why.c_str());
  }
  const double tokens = static_cast<double>(spec.batch_size * spec.seq_len);
  if (!hybrid.picks.empty())
    std::fprintf(out, "%s\n", memory_note(spec, hybrid.picks.front().row).c_str());
  std::fprintf(out, "%3s %3s %-18s %2s %4s %-9s %10s %12s %10s %10s %9s\n", "D", "P", "schedule",
               "V", "M", "partition", "pipe_ms", "allreduce_ms", "step_ms", "tok/s", "peak_GiB");
  for (const HybridPick& p : hybrid.picks) {
    const std::string schedule =
        p.row.schedule == "model_parallel" ? "mp" : p.row.schedule + zb_tag(p.row);
    std::fprintf(out, "%3d %3d %-18s %2d %4d %-9s %10.3f %12.3f %10.3f %10.0f %9.3f\n", p.dp, p.pp,
                 schedule.c_str(), p.row.stages_per_rank, p.row.microbatches,
                 name_string(p.row.partition).c_str(), 1e3 * p.row.step_s, 1e3 * p.allreduce_s,
                 1e3 * p.step_s, tokens / p.step_s, peak_gib(p.row));
  }
  for (const HybridPick& p : hybrid.picks) {
    std::fprintf(
        out, "# D=%d x P=%d: layers timed %s\n", p.dp, p.pp,
        p.eager_because.empty() ? "as CUDA graphs" : ("eagerly (" + p.eager_because + ")").c_str());
  }
  if (hybrid.picks.empty()) return;
  const HybridPick& p = hybrid.picks.front();
  const std::string schedule = p.row.schedule == "model_parallel" ? "1f1b" : p.row.schedule;
  const std::string v = p.row.stages_per_rank > 1
                            ? " --stages-per-rank " + std::to_string(p.row.stages_per_rank)
                            : "";
  const std::string extra = std::string(p.row.zero_bubble ? " --zero-bubble" : "") +
                            recompute_flag(spec) + (spec.zero == 1 && p.dp > 1 ? " --zero 1" : "");
  std::fprintf(out,
               "# pick on %d GPU(s): mpirun -np %d pp_train --dp %d --partition %s --schedule %s"
               "%s%s --microbatches %d: %.3f ms per step, %.0f tokens/s\n",
               hybrid.gpus, hybrid.gpus, p.dp, name_string(p.row.partition).c_str(),
               schedule.c_str(), v.c_str(), extra.c_str(), p.row.microbatches, 1e3 * p.step_s,
               tokens / p.step_s);
}

nlohmann::json hybrid_document(const HybridPlan& hybrid, const PlanSpec& spec,
                               const model::GPT2Config& config) {
  const double tokens = static_cast<double>(spec.batch_size * spec.seq_len);
  nlohmann::json rows = nlohmann::json::array();
  for (const HybridPick& p : hybrid.picks) {
    rows.push_back({{"dp", p.dp},
                    {"pp", p.pp},
                    {"schedule", p.row.schedule},
                    {"stages_per_rank", p.row.stages_per_rank},
                    {"zero_bubble", p.row.zero_bubble},
                    {"microbatches", p.row.microbatches},
                    {"partition", name_string(p.row.partition)},
                    {"split", p.row.split},
                    {"pipeline_step_s", p.row.step_s},
                    {"layers_timed_as", p.eager_because.empty() ? "cuda_graphs" : "eager"},
                    {"allreduce_s", p.allreduce_s},
                    {"step_s", p.step_s},
                    {"tokens_per_s", tokens / p.step_s},
                    {"peak_memory_bytes", p.row.peak_memory_bytes},
                    {"peak_memory_measured", p.row.peak_memory_measured}});
  }
  return {{"program", "pp_plan"},
          {"model", model::describe(config)},
          {"gpus", hybrid.gpus},
          {"batch_size", spec.batch_size},
          {"seq_len", spec.seq_len},
          {"precision", name_string(spec.precision)},
          {"kernels", name_string(spec.kernels)},
          {"link_gbs", spec.link_gbs},
          {"allreduce_gbs", hybrid.allreduce_gbs},
          {"loss_fraction", spec.loss_fraction},
          {"recompute", name_string(spec.recompute)},
          {"zero", spec.zero},
          {"hybrid", rows}};
}

}  // namespace gpt2p::pipeline
