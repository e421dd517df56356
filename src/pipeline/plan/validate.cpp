// validate(): the rules every schedule must keep (simulator.h), checked without running it.
#include <algorithm>
#include <array>
#include <sstream>
#include <string>
#include <vector>

#include "action_counts.h"
#include "gpt2p/pipeline/plan/simulator.h"

namespace gpt2p::pipeline {

using detail::has_weight_actions;
using detail::kNumOps;
using detail::live_delta;
using detail::op_index;
using Op = Action::Op;

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
      const bool backward_work = a.op == Op::kBackward || a.op == Op::kWeight ||
                                 a.op == Op::kSendGrad || a.op == Op::kRecvGrad;
      if (options.forward_only && backward_work) {
        report(k, a, "backward work in a forward-only schedule (F and activation transfers only)");
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
          if (!options.forward_only) ++live;  // forward only: nothing kept for a backward
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
  const bool backward = !options.forward_only;
  for (int s = 0; s < n; ++s) {
    const Rule rules[] = {
        {Op::kForward, true, "forwarded"},
        {Op::kBackward, backward, "backwarded"},
        {Op::kWeight, backward && split_any, "gets its weight gradients (W)"},
        {Op::kSendActivation, comm && s < n - 1, "sends its activation to the next stage"},
        {Op::kRecvGrad, backward && comm && s < n - 1, "receives its gradient from the next stage"},
        {Op::kRecvActivation, comm && s > 0, "receives its activation from the previous stage"},
        {Op::kSendGrad, backward && comm && s > 0, "sends its gradient to the previous stage"},
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
