#include "gpt2p/pipeline/perf/hybrid.h"

#include <algorithm>
#include <sstream>

#include "gpt2p/core/error.h"

namespace gpt2p::pipeline {

PlanSpec hybrid_spec(const PlanSpec& spec, int gpus, int dp, int64_t n_layer, std::string& skip) {
  PlanSpec replica = spec;
  replica.stages = gpus / dp;
  replica.replicas = dp;
  replica.batch_size = spec.batch_size / dp;
  replica.microbatches.clear();
  for (int m : spec.microbatches) {
    if (replica.batch_size % m == 0) replica.microbatches.push_back(m);
  }
  if (replica.microbatches.empty()) replica.microbatches = {1};
  if (replica.stages == 1) replica.stages_per_rank = {1};
  skip = spec.batch_size % dp != 0 ? "--batch-size " + std::to_string(spec.batch_size) +
                                         " does not split over " + std::to_string(dp) + " replicas"
                                   : why_no_plan(replica, n_layer);
  return replica;
}

std::string why_no_hybrid_plan(const PlanSpec& spec, int gpus, int64_t n_layer) {
  std::string why;
  for (int dp = 1; dp <= gpus; ++dp) {
    if (gpus % dp != 0) continue;
    std::string skip;
    hybrid_spec(spec, gpus, dp, n_layer, skip);
    if (skip.empty()) return "";
    why += (why.empty() ? "" : "; ") + std::string("D=") + std::to_string(dp) +
           " x P=" + std::to_string(gpus / dp) + ": " + skip;
  }
  return why;
}

double busiest_rank_gradient_bytes(const model::GPT2Config& config, const std::string& split,
                                   int ranks) {
  std::vector<double> per_rank(static_cast<size_t>(ranks), 0.0);
  std::stringstream ss(split);
  std::string stage;
  for (int s = 0; std::getline(ss, stage, '|'); ++s) {
    const auto dash = stage.find('-');
    const int first = std::stoi(stage.substr(0, dash));
    const int last = dash == std::string::npos ? first : std::stoi(stage.substr(dash + 1));
    double params = 0;
    for (int l = first; l <= last; ++l) params += static_cast<double>(config.layer_parameters(l));
    if (last == config.num_stage_layers() - 1 && first > 0) {
      params += static_cast<double>(config.padded_vocab_size() * config.n_embd);
    }
    per_rank[static_cast<size_t>(s % ranks)] += 4.0 * params;
  }
  return *std::max_element(per_rank.begin(), per_rank.end());
}

HybridPlan plan_hybrid(const model::GPT2Config& config, const PlanSpec& spec, int gpus,
                       double allreduce_gbs, const c10::Device& device) {
  HybridPlan hybrid;
  hybrid.gpus = gpus;
  hybrid.allreduce_gbs = allreduce_gbs;
  // The same step tail for every split: timed once.
  PlanSpec timed = spec;
  timed.tail = measure_plan_tail(config, spec, device);
  for (int dp = 1; dp <= gpus; ++dp) {
    if (gpus % dp != 0) continue;
    const int pp = gpus / dp;
    std::string skip;
    const PlanSpec replica = hybrid_spec(timed, gpus, dp, config.n_layer, skip);
    if (!skip.empty()) {
      hybrid.skipped.push_back({dp, pp, skip});
      continue;
    }
    const Plan plan = make_plan(config, replica, device);
    const PlanRow* best = nullptr;
    for (const auto& r : plan.rows) {
      if (best == nullptr || r.step_s < best->step_s) best = &r;
    }
    if (best == nullptr) continue;
    const double bytes = busiest_rank_gradient_bytes(config, best->split, pp);
    const double allreduce = dp == 1 ? 0.0 : 2.0 * (dp - 1) / dp * bytes / (allreduce_gbs * 1e9);
    hybrid.picks.push_back(
        {dp, pp, *best, allreduce, best->step_s + allreduce, plan.eager_because});
  }
  // pp_plan refuses a --gpus without a split that has a plan (why_no_hybrid_plan); this is only a
  // safety net.
  GPT2P_CHECK(!hybrid.picks.empty(), "pp_plan: no D x P split of " << gpus << " GPUs gave a plan",
              "change --gpus, --batch-size or --stages-per-rank");
  std::sort(hybrid.picks.begin(), hybrid.picks.end(),
            [](const HybridPick& a, const HybridPick& b) { return a.step_s < b.step_s; });
  return hybrid;
}

}  // namespace gpt2p::pipeline
