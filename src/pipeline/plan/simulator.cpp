#include "gpt2p/pipeline/plan/simulator.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <deque>
#include <map>
#include <sstream>
#include <tuple>

#include "action_counts.h"
#include "gpt2p/core/error.h"

namespace gpt2p::pipeline {
namespace {

using Op = Action::Op;
using detail::has_weight_actions;
using detail::is_forward_only;
using detail::live_delta;

// Per-stage costs of the compute actions, resolved from SimCosts.
struct ComputeCosts {
  std::vector<double> forward, backward, weight;
  // The duration of compute action `a` (F, B or W) on its stage.
  double of(const Action& a) const {
    if (a.op == Op::kForward) return forward[a.stage];
    return a.op == Op::kWeight ? weight[a.stage] : backward[a.stage];
  }
};

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
      double compute_end = 0.0;              // end of the last compute action so far
      double stream_end[kNumChannels] = {};  // end of the last transfer on each stream
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
    const bool forward_only = is_forward_only(schedule[r]);
    for (size_t k = 0; k < pc[r]; ++k) {
      const Action& a = schedule[r][k];
      result.timings[r].push_back({post[r][k], end[r][k]});
      result.makespan = std::max(result.makespan, end[r][k]);
      if (!a.is_compute()) continue;
      result.busy[r] += end[r][k] - post[r][k];
      live += live_delta(a, split, forward_only);
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
  std::vector<bool> split(n), forward_only(n);
  for (int r = 0; r < n; ++r) {
    split[r] = has_weight_actions(schedule[r]);
    forward_only[r] = is_forward_only(schedule[r]);
  }
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
          live[r] += live_delta(a, split[r], forward_only[r]);
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

}  // namespace gpt2p::pipeline
