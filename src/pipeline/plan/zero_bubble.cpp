#include "gpt2p/pipeline/plan/zero_bubble.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <sstream>
#include <string>

#include "action_counts.h"
#include "gpt2p/core/error.h"
#include "schedule_table.h"

namespace gpt2p::pipeline {

using Op = Action::Op;

namespace {

// The per-stage costs of zero_bubble_schedule: one finite value >= 0 per stage.
void check_stage_costs(const std::vector<double>& costs, int n_stages, const char* name) {
  GPT2P_CHECK(static_cast<int>(costs.size()) == n_stages,
              "zero_bubble_schedule: costs." << name << " has " << costs.size() << " entries for "
                                             << n_stages << " stages (the size of costs.forward)",
              "give one " << name << " cost per stage");
  for (size_t s = 0; s < costs.size(); ++s) {
    GPT2P_CHECK(std::isfinite(costs[s]) && costs[s] >= 0.0,
                "zero_bubble_schedule: costs." << name << " of stage " << s << " is " << costs[s],
                "costs are durations: use finite values >= 0");
  }
}

}  // namespace

std::vector<int> peak_live(const Schedule& schedule) {
  std::vector<int> peaks;
  for (const RankActions& actions : schedule) {
    // An F makes its micro-batch live; its W frees it, or its B when the list has no W's.
    const bool split = detail::has_weight_actions(actions);
    int live = 0, peak = 0;
    for (const Action& a : actions) peak = std::max(peak, live += detail::live_delta(a, split));
    peaks.push_back(peak);
  }
  return peaks;
}

Schedule zero_bubble_schedule(const Schedule& base, const ZeroBubbleCosts& costs, int extra_live) {
  const int R = static_cast<int>(base.size());
  const int n = static_cast<int>(costs.forward.size());
  GPT2P_CHECK(R >= 1, "zero_bubble_schedule: the base schedule has no rank lists",
              "pass one action list per rank, e.g. from one_f_one_b_schedule");
  GPT2P_CHECK(
      n >= R && n % R == 0,
      "zero_bubble_schedule: costs.forward has " << n << " entries (stages) for " << R << " ranks",
      "give one forward cost per stage; the stages are a multiple of the ranks");
  check_stage_costs(costs.forward, n, "forward");
  check_stage_costs(costs.input_backward, n, "input_backward");
  check_stage_costs(costs.weight_backward, n, "weight_backward");
  GPT2P_CHECK(std::isfinite(costs.comm) && costs.comm >= 0.0,
              "zero_bubble_schedule: costs.comm is " << costs.comm, "use a finite comm cost >= 0");
  GPT2P_CHECK(extra_live >= 0 || extra_live == kNoLiveLimit,
              "zero_bubble_schedule: extra_live is " << extra_live,
              "use 0 (the base schedule's memory), more micro-batches, or kNoLiveLimit (-1)");

  // The base must be compute-only F/B on the right ranks, each (op, stage, micro-batch) at most
  // once: placing an action records its end time, and a second copy would overwrite it.
  int m = 0;
  for (int r = 0; r < R; ++r) {
    for (const Action& a : base[r]) {
      GPT2P_CHECK(a.op != Op::kWeight,
                  "zero_bubble_schedule: rank " << r << " of the base already holds '"
                                                << to_string(a) << "'",
                  "pass the base schedule with whole backwards (F and B only); "
                  "zero_bubble_schedule splits every B into B and W itself");
      GPT2P_CHECK(
          a.is_compute(),
          "zero_bubble_schedule: rank " << r << " of the base holds '" << to_string(a) << "'",
          "pass a compute-only schedule and call add_communication on the result");
      GPT2P_CHECK(a.stage >= 0 && a.stage < n && rank_of_stage(a.stage, R) == r,
                  "zero_bubble_schedule: rank " << r << " holds '" << to_string(a) << "' of stage "
                                                << a.stage << " (of " << n << ")",
                  "put the actions of stage s in list number s % <ranks>, and give costs for "
                  "every stage");
      GPT2P_CHECK(a.microbatch >= 0,
                  "zero_bubble_schedule: '" << to_string(a) << "' has a negative micro-batch",
                  "number the micro-batches 0, 1, ...");
      m = std::max(m, a.microbatch + 1);
    }
  }
  // Per stage and micro-batch: how often the base holds F (B), then when the placed one ends.
  constexpr double kUnknown = -1.0;
  std::vector<std::vector<int>> f_count(n, std::vector<int>(m, 0)), b_count = f_count;
  for (int r = 0; r < R; ++r) {
    for (const Action& a : base[r]) {
      int& c = (a.op == Op::kForward ? f_count : b_count)[a.stage][a.microbatch];
      GPT2P_CHECK(++c == 1, "zero_bubble_schedule: the base runs '" << to_string(a) << "' twice",
                  "run every F and B of every stage once");
    }
  }
  std::vector<std::vector<double>> f_end(n, std::vector<double>(m, kUnknown)), b_end = f_end;

  // The action whose end `a` waits for that is not placed yet, or `a` itself when none is: F
  // needs the previous stage's F, B its own F and the next stage's B.
  const auto missing = [&](const Action& a) {
    const int s = a.stage, i = a.microbatch;
    if (a.op == Op::kForward) {
      return s > 0 && f_end[s - 1][i] == kUnknown ? Action{Op::kForward, s - 1, i, -1} : a;
    }
    if (f_end[s][i] == kUnknown) return Action{Op::kForward, s, i, -1};
    return s < n - 1 && b_end[s + 1][i] == kUnknown ? Action{Op::kBackward, s + 1, i, -1} : a;
  };
  // When base action `a` can start at the earliest; kUnknown while what it needs is not placed.
  const auto ready_time = [&](const Action& a) {
    if (missing(a) != a) return kUnknown;
    const int s = a.stage, i = a.microbatch;
    if (a.op == Op::kForward) return s > 0 ? f_end[s - 1][i] + costs.comm : 0.0;
    return s < n - 1 ? std::max(f_end[s][i], b_end[s + 1][i] + costs.comm) : f_end[s][i];
  };

  struct RankState {
    size_t pc = 0;               // next base action
    double now = 0.0;            // when the rank is free again
    std::deque<Action> pending;  // deferred W's, in the order their B's ran
    int live = 0;                // micro-batches between their F and their W
  };
  std::vector<RankState> state(R);
  const std::vector<int> base_peak = peak_live(base);
  const int peak = *std::max_element(base_peak.begin(), base_peak.end());
  constexpr int kMax = std::numeric_limits<int>::max();
  const int max_live =
      extra_live == kNoLiveLimit || extra_live > kMax - peak ? kMax : peak + extra_live;
  Schedule out(R);
  for (;;) {
    // Advance the rank that is free earliest among those that can place something now: a base
    // action whose inputs are placed (its start is then known), or a deferred W. A rank waiting
    // on an unplaced action with no W to fill the wait stays put until another rank places it.
    int pick = -1;
    bool work_left = false;
    for (int r = 0; r < R; ++r) {
      const RankState& rs = state[r];
      const bool base_left = rs.pc < base[r].size();
      if (!base_left && rs.pending.empty()) continue;
      work_left = true;
      const bool can_act = !rs.pending.empty() || ready_time(base[r][rs.pc]) != kUnknown;
      if (can_act && (pick < 0 || rs.now < state[pick].now)) pick = r;
    }
    if (!work_left) break;
    if (pick < 0) {
      // Every rank with work left waits on an action no rank will ever place.
      std::ostringstream stuck;
      for (int r = 0; r < R; ++r) {
        if (state[r].pc == base[r].size()) continue;
        const Action& a = base[r][state[r].pc];
        const Action need = missing(a);
        const int q = rank_of_stage(need.stage, R);
        const bool in_base =
            (need.op == Op::kForward ? f_count : b_count)[need.stage][need.microbatch] > 0;
        stuck << (stuck.tellp() > 0 ? "; " : "") << "rank " << r << " waits at '" << to_string(a)
              << "' for '" << to_string(need) << "', which "
              << (in_base ? "rank " + std::to_string(q) + " has not run yet"
                          : std::string("the base schedule does not contain"));
      }
      GPT2P_FAIL("zero_bubble_schedule: the base schedule can never finish: " << stuck.str(),
                 "pass a base schedule that runs every F and B of every stage in an order the "
                 "ranks can follow, e.g. from one_f_one_b_schedule or interleaved_schedule");
    }
    RankState& rs = state[pick];
    const auto run_oldest_w = [&] {
      GPT2P_CHECK(!rs.pending.empty(),
                  "zero_bubble_schedule: rank " << pick << " has no W to run at action " << rs.pc,
                  "report this: the memory bound left a rank without a W to run");
      const Action w = rs.pending.front();
      rs.pending.pop_front();
      rs.now += costs.weight_backward[w.stage];
      --rs.live;
      out[pick].push_back(w);
    };
    if (rs.pc == base[pick].size()) {
      run_oldest_w();  // after the last base action: the rest, oldest first
      continue;
    }
    const Action& a = base[pick][rs.pc];
    // An F that would hold more micro-batches than allowed waits for the oldest W. There is one:
    // the base holds at most its peak between F and B here, and W's not run yet make up the rest.
    if (a.op == Op::kForward && rs.live >= max_live) {
      run_oldest_w();
      continue;
    }
    const double ready = ready_time(a);
    // Fill a wait with the oldest W when it is worth it: a W at most twice as long as the wait
    // delays the next base action by at most half its cost. An unknown wait (the input is not
    // even placed yet) counts as long enough.
    if (!rs.pending.empty() &&
        (ready == kUnknown ||
         (ready > rs.now &&
          ready - rs.now >= 0.5 * costs.weight_backward[rs.pending.front().stage]))) {
      run_oldest_w();
      continue;
    }
    // Here `ready` is known (a rank with an unknown wait and no W was not picked).
    const double start = std::max(rs.now, ready);
    const int s = a.stage, i = a.microbatch;
    if (a.op == Op::kForward) {
      rs.now = start + costs.forward[s];
      f_end[s][i] = rs.now;
      ++rs.live;
    } else {
      rs.now = start + costs.input_backward[s];
      b_end[s][i] = rs.now;
      rs.pending.push_back({Op::kWeight, s, i, -1});
    }
    out[pick].push_back(a);
    ++rs.pc;
  }
  return out;
}

ZeroBubbleCosts zero_bubble_costs(const Partition& split, int n_layer, int n_embd, int seq_len,
                                  int vocab_size, double loss_fraction) {
  GPT2P_CHECK(n_layer >= 1 && n_embd >= 1 && seq_len >= 1 && vocab_size >= 1,
              "zero_bubble_costs: n_layer " << n_layer << ", n_embd " << n_embd << ", seq_len "
                                            << seq_len << ", vocab_size " << vocab_size
                                            << ": all must be >= 1",
              "pass the model config");
  GPT2P_CHECK(loss_fraction > 0 && loss_fraction <= 1,
              "zero_bubble_costs: loss fraction " << loss_fraction << " is not in (0, 1]",
              "pass the share of positions whose loss counts (1: every position)");
  const double t = seq_len, c = n_embd, v = vocab_size;
  const double linear = 24 * t * c * c, attention = 4 * t * t * c;
  ZeroBubbleCosts costs;
  int next = 0;
  for (const auto& stage : split) {
    GPT2P_CHECK(stage.begin == next && stage.end > stage.begin && stage.end <= n_layer + 2,
                "zero_bubble_costs: stage [" << stage.begin << ", " << stage.end
                                             << ") does not continue the split at layer " << next,
                "pass contiguous, non-empty stages covering layers 0.." << n_layer + 1);
    double f = 0, b = 0, w = 0;
    for (int layer = stage.begin; layer < stage.end; ++layer) {
      if (layer >= 1 && layer <= n_layer) {
        f += linear + attention;
        b += linear + 2 * attention;
        w += linear;
      } else if (layer == n_layer + 1) {
        f += 3 * 2 * t * c * v * loss_fraction;
      }
    }
    costs.forward.push_back(f);
    costs.input_backward.push_back(b);
    costs.weight_backward.push_back(w);
    next = stage.end;
  }
  GPT2P_CHECK(next == n_layer + 2,
              "zero_bubble_costs: the split ends at layer " << next << " of " << n_layer + 2,
              "pass stages covering layers 0.." << n_layer + 1);
  return costs;
}

double block_weight_share(int n_embd, int seq_len) {
  GPT2P_CHECK(n_embd >= 1 && seq_len >= 1,
              "block_weight_share: n_embd " << n_embd << ", seq_len " << seq_len,
              "pass the model width and sequence length (>= 1)");
  const double linear = 24.0 * n_embd, attention = 4.0 * seq_len;  // per T C
  return linear / (3 * (linear + attention));
}

Schedule make_zero_bubble_schedule(ScheduleKind kind, int n_microbatches, int n_ranks,
                                   int stages_per_rank, const ZeroBubbleCosts& costs,
                                   int extra_live) {
  const int n_stages = n_ranks * stages_per_rank;
  const ScheduleInfo& schedule = schedule_info(kind);
  const Schedule base = schedule.compute(n_microbatches, n_ranks, stages_per_rank);
  detail::check_stages_per_rank(schedule, stages_per_rank);
  return add_communication(zero_bubble_schedule(base, costs, extra_live), n_stages);
}

}  // namespace gpt2p::pipeline
