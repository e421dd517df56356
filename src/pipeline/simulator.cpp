#include "gpt2p/pipeline/simulator.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <deque>
#include <map>
#include <sstream>
#include <tuple>

#include "gpt2p/core/error.h"

namespace gpt2p::pipeline {
namespace {

using Op = Action::Op;

// Op values are the op codes of timing files, so they are not contiguous: 6 (the optimizer step
// there) names no action. Tables indexed by op_index keep an unused slot for it.
constexpr int kNumOps = static_cast<int>(Op::kWeight) + 1;
int op_index(Op op) { return static_cast<int>(op); }

// Per-stage costs of the compute actions, resolved from SimCosts.
struct ComputeCosts {
  std::vector<double> forward, backward, weight;
  // The duration of compute action `a` (F, B or W) on its stage.
  double of(const Action& a) const {
    if (a.op == Op::kForward) return forward[a.stage];
    return a.op == Op::kWeight ? weight[a.stage] : backward[a.stage];
  }
};

// Whether a rank's list splits its backwards into B and W: then the inputs a B used stay alive
// until the W (which needs them for the weight gradients), so W, not B, frees an activation.
bool has_weight_actions(const RankActions& list) {
  return std::any_of(list.begin(), list.end(), [](const Action& a) { return a.op == Op::kWeight; });
}

// The change of live activations on a rank (see has_weight_actions) when `a` runs.
int live_delta(const Action& a, bool split_backward) {
  if (a.op == Op::kForward) return 1;
  return a.op == (split_backward ? Op::kWeight : Op::kBackward) ? -1 : 0;
}

// (is gradient, micro-batch, from stage, to stage): what a SEND and its RECV agree on.
using TransferKey = std::tuple<bool, int, int, int>;

TransferKey transfer_key(const Action& a) {
  const bool grad = a.op == Op::kSendGrad || a.op == Op::kRecvGrad;
  return a.is_send() ? TransferKey{grad, a.microbatch, a.stage, a.peer}
                     : TransferKey{grad, a.microbatch, a.peer, a.stage};
}

// Stages of a schedule: one past the highest stage any action names (at least one per rank).
int count_stages(const Schedule& schedule) {
  int n = static_cast<int>(schedule.size());
  for (const auto& list : schedule) {
    for (const Action& a : list) n = std::max({n, a.stage + 1, a.peer + 1});
  }
  return n;
}

// The rank holding `peer` (a stage), or -1 for none.
int peer_rank(const Action& a, int n_ranks) {
  return a.peer >= 0 ? rank_of_stage(a.peer, n_ranks) : -1;
}

std::vector<double> resolve_costs(const std::vector<double>& given, int n, double fallback,
                                  const char* name) {
  if (given.empty()) return std::vector<double>(n, fallback);
  GPT2P_CHECK(
      static_cast<int>(given.size()) == n,
      "simulate: " << name << " costs have " << given.size() << " entries for " << n << " stages",
      "give one " << name << " cost per stage, or none for the defaults (F 1, B 2, W 1)");
  for (size_t s = 0; s < given.size(); ++s) {
    GPT2P_CHECK(std::isfinite(given[s]) && given[s] >= 0.0,
                "simulate: " << name << " cost of stage " << s << " is " << given[s],
                "costs are durations: use finite values >= 0");
  }
  return given;
}

std::string describe_position(const Schedule& schedule, const std::vector<size_t>& pc, int rank) {
  std::ostringstream os;
  if (rank < 0 || rank >= static_cast<int>(schedule.size())) {
    os << "rank " << rank << " does not exist";
  } else if (pc[rank] == schedule[rank].size()) {
    os << "rank " << rank << " has finished its list";
  } else {
    os << "rank " << rank << " is at action #" << pc[rank] << " '"
       << to_string(schedule[rank][pc[rank]]) << "'";
  }
  return os.str();
}

}  // namespace

namespace {

// The NCCL models: transfers queue on streams and meet their partners there (see simulator.h).
// Every action gets its times by fixpoint iteration over its dependencies; what never resolves is
// a deadlock.
SimResult simulate_streams(const Schedule& schedule, const ComputeCosts& cost, double comm,
                           bool per_direction) {
  const int n = static_cast<int>(schedule.size());
  const int n_stages = static_cast<int>(cost.forward.size());
  SimResult result;
  result.busy.assign(n, 0.0);
  result.max_live_activations.assign(n, 0);
  result.timings.resize(n);
  // The partner of every transfer: k-th send of a key <-> k-th receive of it.
  std::map<TransferKey, std::deque<std::pair<int, size_t>>> sends, recvs;
  for (int r = 0; r < n; ++r) {
    for (size_t k = 0; k < schedule[r].size(); ++k) {
      const Action& a = schedule[r][k];
      if (!a.is_compute()) (a.is_send() ? sends : recvs)[transfer_key(a)].emplace_back(r, k);
    }
  }
  constexpr std::pair<int, size_t> kNone{-1, 0};
  std::vector<std::vector<std::pair<int, size_t>>> partner(n);
  for (int r = 0; r < n; ++r) partner[r].assign(schedule[r].size(), kNone);
  for (auto& [key, list] : sends) {
    auto& other = recvs[key];
    while (!list.empty() && !other.empty()) {
      partner[list.front().first][list.front().second] = other.front();
      partner[other.front().first][other.front().second] = list.front();
      list.pop_front();
      other.pop_front();
    }
  }
  const double kUnknown = -1.0;
  std::vector<std::vector<double>> post(n), end(n);
  for (int r = 0; r < n; ++r) {
    post[r].assign(schedule[r].size(), kUnknown);
    end[r].assign(schedule[r].size(), kUnknown);
  }
  auto stream_of = [&](const Action& a) {
    return per_direction ? static_cast<int>(channel_of(a, n)) : 0;
  };
  bool progress = true;
  while (progress) {
    progress = false;
    for (int r = 0; r < n; ++r) {
      const RankActions& list = schedule[r];
      double compute_end = 0.0;                // end of the last compute action so far
      double stream_end[kNumChannels] = {};    // end of the last transfer on each stream
      bool compute_known = true, stream_known[kNumChannels] = {true, true, true, true};
      std::map<std::tuple<bool, int, int>, size_t> recv_at;  // (gradient?, stage, mb) -> index
      for (size_t k = 0; k < list.size(); ++k) {
        const Action& a = list[k];
        if (a.is_compute()) {
          if (end[r][k] == kUnknown && compute_known) {
            double start = compute_end;
            bool ready = true;
            // F and B wait for their receive; W only for the compute before it (its B).
            const bool needs = a.op == Op::kForward    ? a.stage > 0
                               : a.op == Op::kBackward ? a.stage < n_stages - 1
                                                       : false;
            if (needs) {
              auto it = recv_at.find({a.op == Op::kBackward, a.stage, a.microbatch});
              ready = it != recv_at.end() && end[r][it->second] != kUnknown;
              if (ready) start = std::max(start, end[r][it->second]);
            }
            if (ready) {
              post[r][k] = start;
              end[r][k] = start + cost.of(a);
              progress = true;
            }
          }
          compute_known = compute_known && end[r][k] != kUnknown;
          if (compute_known) compute_end = end[r][k];
          continue;
        }
        if (a.is_recv()) recv_at[{a.op == Op::kRecvGrad, a.stage, a.microbatch}] = k;
        const int d = stream_of(a);
        if (post[r][k] == kUnknown && compute_known && stream_known[d]) {
          post[r][k] = std::max(compute_end, stream_end[d]);  // queued behind both
          progress = true;
        }
        if (end[r][k] == kUnknown && post[r][k] != kUnknown) {
          const auto [p, q] = partner[r][k];
          if (p >= 0 && post[p][q] != kUnknown) {
            end[r][k] = std::max(post[r][k], post[p][q]) + comm;
            progress = true;
          }
        }
        stream_known[d] = stream_known[d] && end[r][k] != kUnknown;
        if (stream_known[d]) stream_end[d] = end[r][k];
      }
    }
  }

  std::ostringstream stuck;
  std::vector<size_t> pc(n);
  for (int r = 0; r < n; ++r) {
    pc[r] = 0;
    while (pc[r] < schedule[r].size() && end[r][pc[r]] != kUnknown) ++pc[r];
  }
  for (int r = 0; r < n; ++r) {
    int live = 0;
    const bool split = has_weight_actions(schedule[r]);
    for (size_t k = 0; k < pc[r]; ++k) {
      const Action& a = schedule[r][k];
      result.timings[r].push_back({post[r][k], end[r][k]});
      result.makespan = std::max(result.makespan, end[r][k]);
      if (!a.is_compute()) continue;
      result.busy[r] += end[r][k] - post[r][k];
      live += live_delta(a, split);
      result.max_live_activations[r] = std::max(result.max_live_activations[r], live);
    }
    if (pc[r] == schedule[r].size()) continue;
    const Action& a = schedule[r][pc[r]];
    if (stuck.tellp() > 0) stuck << "\n";
    stuck << "rank " << r << " waits forever at action #" << pc[r] << " '" << to_string(a) << "': "
          << (a.is_compute() ? "its input never arrives" : "the matching transfer never starts")
          << "; " << describe_position(schedule, pc, peer_rank(a, n));
  }
  result.deadlock_reason = stuck.str();
  result.ok = result.deadlock_reason.empty();
  return result;
}

}  // namespace

SimResult simulate(const Schedule& schedule, const SimCosts& costs, Transfers transfers) {
  const int n = static_cast<int>(schedule.size());
  const int n_stages = count_stages(schedule);
  const ComputeCosts cost{resolve_costs(costs.forward, n_stages, 1.0, "forward"),
                          resolve_costs(costs.backward, n_stages, 2.0, "backward"),
                          resolve_costs(costs.weight, n_stages, 1.0, "weight")};
  GPT2P_CHECK(std::isfinite(costs.comm) && costs.comm >= 0.0,
              "simulate: comm cost is " << costs.comm, "use a finite comm cost >= 0");
  if (transfers != Transfers::kBuffered) {
    SimResult r =
        simulate_streams(schedule, cost, costs.comm, transfers == Transfers::kStreamPerDirection);
    double busy = 0.0;
    for (double b : r.busy) busy += b;
    r.bubble_fraction = r.makespan > 0.0 ? 1.0 - busy / (n * r.makespan) : 0.0;
    return r;
  }

  SimResult result;
  result.busy.assign(n, 0.0);
  result.max_live_activations.assign(n, 0);
  result.timings.resize(n);
  std::vector<size_t> pc(n, 0);
  std::vector<double> clock(n, 0.0);
  std::vector<int> live(n, 0);
  std::vector<bool> split(n);
  for (int r = 0; r < n; ++r) split[r] = has_weight_actions(schedule[r]);
  std::map<TransferKey, std::deque<double>> issued;  // send times not yet received

  bool progress = true;
  while (progress) {
    progress = false;
    for (int r = 0; r < n; ++r) {
      const RankActions& list = schedule[r];
      while (pc[r] < list.size()) {
        const Action& a = list[pc[r]];
        ActionTiming t{clock[r], clock[r]};
        if (a.is_compute()) {
          const double d = cost.of(a);  // W: no transfer to wait for, only its place in the list
          t.end = t.start + d;
          result.busy[r] += d;
          live[r] += live_delta(a, split[r]);
          result.max_live_activations[r] = std::max(result.max_live_activations[r], live[r]);
        } else if (a.is_send()) {
          issued[transfer_key(a)].push_back(clock[r]);
        } else {
          auto it = issued.find(transfer_key(a));
          if (it == issued.end() || it->second.empty()) break;  // wait for the sender
          t.end = std::max(t.start, it->second.front() + costs.comm);
          it->second.pop_front();
        }
        clock[r] = t.end;
        result.timings[r].push_back(t);
        ++pc[r];
        progress = true;
      }
    }
  }

  std::ostringstream stuck;
  for (int r = 0; r < n; ++r) {
    if (pc[r] == schedule[r].size()) continue;
    const Action& a = schedule[r][pc[r]];
    if (stuck.tellp() > 0) stuck << "\n";
    stuck << "rank " << r << " waits forever at action #" << pc[r] << " '" << to_string(a)
          << "': no matching send was issued; " << describe_position(schedule, pc, peer_rank(a, n));
  }
  result.deadlock_reason = stuck.str();
  result.ok = result.deadlock_reason.empty();
  for (int r = 0; r < n; ++r) result.makespan = std::max(result.makespan, clock[r]);
  double busy = 0.0;
  for (double b : result.busy) busy += b;
  result.bubble_fraction = result.makespan > 0.0 ? 1.0 - busy / (n * result.makespan) : 0.0;
  return result;
}

std::vector<std::string> validate(const Schedule& schedule, int n_microbatches, int n_stages,
                                  const ValidateOptions& options) {
  const int m = n_microbatches;
  const int n = n_stages;
  const int R = static_cast<int>(schedule.size());
  std::vector<std::string> violations;
  if (R < 1 || n < R || n % R != 0) {
    violations.push_back("the schedule has " + std::to_string(R) + " rank lists for " +
                         std::to_string(n) + " stages");
    return violations;
  }
  // Per stage, per op, per micro-batch: how often it occurred so far.
  std::vector<std::array<std::vector<int>, kNumOps>> count(n);
  for (auto& stage : count) {
    for (auto& c : stage) c.assign(m, 0);
  }
  // A schedule either splits its backwards (then every B has its W) or has no W at all.
  const bool split_any = std::any_of(schedule.begin(), schedule.end(), has_weight_actions);
  for (int r = 0; r < R; ++r) {
    auto report = [&](size_t k, const Action& a, const std::string& what) {
      violations.push_back("rank " + std::to_string(r) + " action #" + std::to_string(k) + " '" +
                           to_string(a) + "': " + what);
    };
    // The 1F1B bound applies to one stage per rank: min(m, n - s) on stage s == r.
    const int live_limit = std::min(m, n - r);
    int live = 0;
    const RankActions& list = schedule[r];
    const bool split = has_weight_actions(list);
    for (size_t k = 0; k < list.size(); ++k) {
      const Action& a = list[k];
      const int mb = a.microbatch;
      const int s = a.stage;
      if (s < 0 || s >= n || rank_of_stage(s, R) != r) {
        report(k, a,
               "names stage " + std::to_string(s) + " on rank " + std::to_string(r) +
                   " (rank r runs " +
                   (R == n ? std::string("stage r)")
                           : "the stages s with s % " + std::to_string(R) + " == r)"));
        continue;
      }
      if (mb < 0 || mb >= m) {
        report(k, a, "micro-batch out of range [0, " + std::to_string(m) + ")");
        continue;
      }
      if (!a.is_compute() && !options.check_communication) continue;
      auto& seen = count[s][op_index(a.op)];
      const auto happened = [&](Op op) { return count[s][op_index(op)][mb] > 0; };
      switch (a.op) {
        case Op::kForward:
          if (options.check_communication && s > 0 && !happened(Op::kRecvActivation)) {
            report(k, a, "F before its RECV_F (the input activation is not there yet)");
          }
          ++live;
          if (options.limit_live_activations && live > live_limit) {
            report(k, a,
                   std::to_string(live) + " activations alive; 1F1B allows at most " +
                       std::to_string(live_limit) + " on stage " + std::to_string(s));
          }
          break;
        case Op::kBackward:
          if (!happened(Op::kForward)) report(k, a, "B before its F");
          if (options.check_communication && s < n - 1 && !happened(Op::kRecvGrad)) {
            report(k, a, "B before its RECV_B (the output gradient is not there yet)");
          }
          live += live_delta(a, split);
          break;
        case Op::kWeight:
          if (!happened(Op::kBackward)) {
            report(k, a, "W before its B (the weight gradients need the B's output gradient)");
          }
          if (happened(Op::kWeight)) report(k, a, "a second W of this micro-batch (one per B)");
          live += live_delta(a, split);
          break;
        case Op::kSendActivation:
        case Op::kRecvGrad:
          if (a.peer != s + 1 || s + 1 >= n) {
            report(k, a,
                   s + 1 >= n ? "the last stage has no next stage to talk to"
                              : "peer must be the next stage " + std::to_string(s + 1));
            continue;
          }
          if (a.op == Op::kSendActivation && !happened(Op::kForward)) {
            report(k, a, "SEND_F before the F that produces the activation");
          }
          break;
        case Op::kRecvActivation:
        case Op::kSendGrad:
          if (a.peer != s - 1 || s == 0) {
            report(k, a,
                   s == 0 ? "the first stage has no previous stage to talk to"
                          : "peer must be the previous stage " + std::to_string(s - 1));
            continue;
          }
          if (a.op == Op::kSendGrad && !happened(Op::kBackward)) {
            report(k, a, "SEND_B before the B that produces the gradient");
          }
          break;
      }
      if (a.is_compute() && a.peer != -1) report(k, a, "F, B and W take no peer (use -1)");
      ++seen[mb];
    }
  }

  // Exactly-once rules. A send at s and its recv at s +- 1 are each required exactly once, so
  // every (kind, micro-batch, from, to) is matched one to one.
  struct Rule {
    Op op;
    bool applies;
    const char* what;
  };
  const bool comm = options.check_communication;
  for (int s = 0; s < n; ++s) {
    const Rule rules[] = {
        {Op::kForward, true, "forwarded"},
        {Op::kBackward, true, "backwarded"},
        {Op::kWeight, split_any, "gets its weight gradients (W)"},
        {Op::kSendActivation, comm && s < n - 1, "sends its activation to the next stage"},
        {Op::kRecvGrad, comm && s < n - 1, "receives its gradient from the next stage"},
        {Op::kRecvActivation, comm && s > 0, "receives its activation from the previous stage"},
        {Op::kSendGrad, comm && s > 0, "sends its gradient to the previous stage"},
    };
    for (const Rule& rule : rules) {
      if (!rule.applies) continue;
      for (int mb = 0; mb < m; ++mb) {
        const int c = count[s][op_index(rule.op)][mb];
        if (c == 1) continue;
        violations.push_back("stage " + std::to_string(s) + ": micro-batch " + std::to_string(mb) +
                             " " + rule.what + " " + std::to_string(c) +
                             " times (expected exactly once)");
      }
    }
  }
  return violations;
}

}  // namespace gpt2p::pipeline
