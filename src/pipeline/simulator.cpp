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

constexpr int kNumOps = 6;
int op_index(Op op) { return static_cast<int>(op); }

// (is gradient, micro-batch, from stage, to stage): what a SEND and its RECV agree on.
using TransferKey = std::tuple<bool, int, int, int>;

TransferKey transfer_key(const Action& a, int rank) {
  const bool grad = a.op == Op::kSendGrad || a.op == Op::kRecvGrad;
  return a.is_send() ? TransferKey{grad, a.microbatch, rank, a.peer}
                     : TransferKey{grad, a.microbatch, a.peer, rank};
}

std::vector<double> resolve_costs(const std::vector<double>& given, int n, double fallback,
                                  const char* name) {
  if (given.empty()) return std::vector<double>(n, fallback);
  GPT2P_CHECK(
      static_cast<int>(given.size()) == n,
      "simulate: " << name << " costs have " << given.size() << " entries for " << n << " stages",
      "give one " << name << " cost per stage, or none for the defaults (F 1, B 2)");
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

SimResult simulate(const Schedule& schedule, const SimCosts& costs, Transfers transfers) {
  const int n = static_cast<int>(schedule.size());
  const std::vector<double> fwd = resolve_costs(costs.forward, n, 1.0, "forward");
  const std::vector<double> bwd = resolve_costs(costs.backward, n, 2.0, "backward");
  GPT2P_CHECK(std::isfinite(costs.comm) && costs.comm >= 0.0,
              "simulate: comm cost is " << costs.comm, "use a finite comm cost >= 0");

  SimResult result;
  result.busy.assign(n, 0.0);
  result.max_live_activations.assign(n, 0);
  result.timings.resize(n);
  std::vector<size_t> pc(n, 0);
  std::vector<double> clock(n, 0.0);
  std::vector<int> live(n, 0);
  std::map<TransferKey, std::deque<double>> issued;  // kBuffered: send times not yet received

  // Rendezvous models: the group rank r is posting, [pc, group_end), since post_time; per action,
  // when its transfer met its partner (negative: not yet).
  const bool rendezvous = transfers != Transfers::kBuffered;
  std::vector<size_t> group_end(n, 0);
  std::vector<double> post_time(n, -1.0);
  std::vector<std::vector<double>> met(n);
  for (int r = 0; r < n; ++r) met[r].assign(schedule[r].size(), -1.0);
  auto posting = [&](int r) { return r >= 0 && r < n && pc[r] < group_end[r]; };
  // Matches rank r's waiting transfers with the peers' posted groups; true when all have met.
  auto match_group = [&](int r) {
    bool all = true;
    for (size_t k = pc[r]; k < group_end[r]; ++k) {
      if (met[r][k] >= 0.0) continue;
      const Action& a = schedule[r][k];
      const int p = a.peer;
      bool found = false;
      if (posting(p)) {
        for (size_t q = pc[p]; q < group_end[p] && !found; ++q) {
          const Action& b = schedule[p][q];
          if (met[p][q] >= 0.0 || b.is_send() == a.is_send() || b.peer != r ||
              transfer_key(b, p) != transfer_key(a, r)) {
            continue;
          }
          met[r][k] = met[p][q] = std::max(post_time[r], post_time[p]) + costs.comm;
          found = true;
        }
      }
      all = all && found;
    }
    return all;
  };

  bool progress = true;
  while (progress) {
    progress = false;
    for (int r = 0; r < n; ++r) {
      const RankActions& list = schedule[r];
      while (pc[r] < list.size()) {
        const Action& a = list[pc[r]];
        ActionTiming t{clock[r], clock[r]};
        if (a.is_compute()) {
          const double d = a.op == Op::kForward ? fwd[r] : bwd[r];
          t.end = t.start + d;
          result.busy[r] += d;
          live[r] += a.op == Op::kForward ? 1 : -1;
          result.max_live_activations[r] = std::max(result.max_live_activations[r], live[r]);
        } else if (rendezvous) {
          if (!posting(r)) {  // arrive at a new group and post it
            size_t e = pc[r] + 1;
            if (transfers == Transfers::kGrouped) {
              while (e < list.size() && !list[e].is_compute()) ++e;
            }
            group_end[r] = e;
            post_time[r] = clock[r];
          }
          if (!match_group(r)) break;  // wait for the peers
          double done = clock[r];
          for (size_t k = pc[r]; k < group_end[r]; ++k) {
            result.timings[r].push_back({post_time[r], met[r][k]});
            done = std::max(done, met[r][k]);
          }
          clock[r] = done;
          pc[r] = group_end[r];
          progress = true;
          continue;
        } else if (a.is_send()) {
          issued[transfer_key(a, r)].push_back(clock[r]);
        } else {
          auto it = issued.find(transfer_key(a, r));
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
    size_t k = pc[r];
    if (rendezvous) {  // name the first transfer of the group that found no partner
      while (k + 1 < group_end[r] && met[r][k] >= 0.0) ++k;
    }
    const Action& a = schedule[r][k];
    if (stuck.tellp() > 0) stuck << "\n";
    stuck << "rank " << r << " waits forever at action #" << k << " '" << to_string(a) << "': "
          << (rendezvous ? "its peer is not posting the matching transfer"
                         : "no matching send was issued")
          << "; " << describe_position(schedule, pc, a.peer);
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
  std::vector<std::string> violations;
  if (static_cast<int>(schedule.size()) != n) {
    violations.push_back("the schedule has " + std::to_string(schedule.size()) +
                         " rank lists for " + std::to_string(n) + " stages");
    return violations;
  }
  for (int r = 0; r < n; ++r) {
    auto report = [&](size_t k, const Action& a, const std::string& what) {
      violations.push_back("rank " + std::to_string(r) + " action #" + std::to_string(k) + " '" +
                           to_string(a) + "': " + what);
    };
    // Per micro-batch: how often each op occurs on this rank, and whether it has happened yet.
    std::array<std::vector<int>, kNumOps> count;
    for (auto& c : count) c.assign(m, 0);
    const int live_limit = std::min(m, n - r);
    int live = 0;
    const RankActions& list = schedule[r];
    for (size_t k = 0; k < list.size(); ++k) {
      const Action& a = list[k];
      const int mb = a.microbatch;
      if (a.stage != r)
        report(k, a,
               "names stage " + std::to_string(a.stage) + " on rank " + std::to_string(r) +
                   " (rank r runs stage r)");
      if (mb < 0 || mb >= m) {
        report(k, a, "micro-batch out of range [0, " + std::to_string(m) + ")");
        continue;
      }
      if (!a.is_compute() && !options.check_communication) continue;
      auto& seen = count[op_index(a.op)];
      const auto happened = [&](Op op) { return count[op_index(op)][mb] > 0; };
      switch (a.op) {
        case Op::kForward:
          if (options.check_communication && r > 0 && !happened(Op::kRecvActivation)) {
            report(k, a, "F before its RECV_F (the input activation is not there yet)");
          }
          ++live;
          if (options.limit_live_activations && live > live_limit) {
            report(k, a,
                   std::to_string(live) + " activations alive; 1F1B allows at most " +
                       std::to_string(live_limit) + " on stage " + std::to_string(r));
          }
          break;
        case Op::kBackward:
          if (!happened(Op::kForward)) report(k, a, "B before its F");
          if (options.check_communication && r < n - 1 && !happened(Op::kRecvGrad)) {
            report(k, a, "B before its RECV_B (the output gradient is not there yet)");
          }
          --live;
          break;
        case Op::kSendActivation:
        case Op::kRecvGrad:
          if (a.peer != r + 1 || r + 1 >= n) {
            report(k, a,
                   r + 1 >= n ? "the last stage has no next stage to talk to"
                              : "peer must be the next stage " + std::to_string(r + 1));
            continue;
          }
          if (a.op == Op::kSendActivation && !happened(Op::kForward)) {
            report(k, a, "SEND_F before the F that produces the activation");
          }
          break;
        case Op::kRecvActivation:
        case Op::kSendGrad:
          if (a.peer != r - 1 || r == 0) {
            report(k, a,
                   r == 0 ? "the first stage has no previous stage to talk to"
                          : "peer must be the previous stage " + std::to_string(r - 1));
            continue;
          }
          if (a.op == Op::kSendGrad && !happened(Op::kBackward)) {
            report(k, a, "SEND_B before the B that produces the gradient");
          }
          break;
      }
      if (a.is_compute() && a.peer != -1) report(k, a, "F and B take no peer (use -1)");
      ++seen[mb];
    }

    // Exactly-once rules. A send at r and its recv at r +- 1 are each required exactly once, so
    // every (kind, micro-batch, from, to) is matched one to one.
    struct Rule {
      Op op;
      bool applies;
      const char* what;
    };
    const bool comm = options.check_communication;
    const Rule rules[] = {
        {Op::kForward, true, "forwarded"},
        {Op::kBackward, true, "backwarded"},
        {Op::kSendActivation, comm && r < n - 1, "sends its activation to the next stage"},
        {Op::kRecvGrad, comm && r < n - 1, "receives its gradient from the next stage"},
        {Op::kRecvActivation, comm && r > 0, "receives its activation from the previous stage"},
        {Op::kSendGrad, comm && r > 0, "sends its gradient to the previous stage"},
    };
    for (const Rule& rule : rules) {
      if (!rule.applies) continue;
      for (int mb = 0; mb < m; ++mb) {
        const int c = count[op_index(rule.op)][mb];
        if (c == 1) continue;
        violations.push_back("rank " + std::to_string(r) + ": micro-batch " + std::to_string(mb) +
                             " " + rule.what + " " + std::to_string(c) +
                             " times (expected exactly once)");
      }
    }
  }
  return violations;
}

}  // namespace gpt2p::pipeline
