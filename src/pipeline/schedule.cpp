#include "gpt2p/pipeline/schedule.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <deque>
#include <sstream>

#include "gpt2p/core/error.h"

namespace gpt2p::pipeline {
namespace {

using Op = Action::Op;

struct OpName {
  Op op;
  const char* name;
};
// No name is a prefix of another, so the first match while parsing is the only one.
constexpr std::array<OpName, 7> kOpNames{{{Op::kSendActivation, "SEND_F"},
                                          {Op::kRecvActivation, "RECV_F"},
                                          {Op::kSendGrad, "SEND_B"},
                                          {Op::kRecvGrad, "RECV_B"},
                                          {Op::kForward, "F"},
                                          {Op::kBackward, "B"},
                                          {Op::kWeight, "W"}}};

const char* op_name(Op op) {
  for (const auto& e : kOpNames) {
    if (e.op == op) return e.name;
  }
  return "?";
}

void check_sizes(int n_microbatches, int n_stages, const char* what) {
  GPT2P_CHECK(n_microbatches >= 1, what << ": n_microbatches = " << n_microbatches << " < 1",
              "use at least one micro-batch per step");
  GPT2P_CHECK(n_stages >= 1, what << ": n_stages = " << n_stages << " < 1",
              "use at least one pipeline stage (one rank)");
}

// Reads a non-negative decimal number at text[pos...]; returns -1 when there is none.
int read_number(std::string_view text, size_t& pos) {
  const size_t start = pos;
  long value = 0;
  while (pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos])) != 0) {
    value = value * 10 + (text[pos] - '0');
    if (value > 1000000000L) return -1;
    ++pos;
  }
  return pos == start ? -1 : static_cast<int>(value);
}

constexpr const char* kActionForm =
    "write <stage><op><microbatch>[->peer|<-peer] with op one of F, B, W, SEND_F, RECV_F, "
    "SEND_B, RECV_B, e.g. 2F0, 1B3, 1W3, 0SEND_F1->1, 1RECV_F1<-0";

}  // namespace

std::ostream& operator<<(std::ostream& os, const Cell& c) {
  return os << "(" << c.microbatch << "," << c.stage << ")";
}

std::vector<std::vector<Cell>> clock_cycles(int n_microbatches, int n_stages) {
  check_sizes(n_microbatches, n_stages, "clock_cycles");
  std::vector<std::vector<Cell>> ticks(n_microbatches + n_stages - 1);
  for (int k = 0; k < static_cast<int>(ticks.size()); ++k) {
    for (int j = std::max(0, k - n_microbatches + 1); j <= std::min(k, n_stages - 1); ++j) {
      ticks[k].push_back(Cell{k - j, j});
    }
  }
  return ticks;
}

std::string to_string(const Action& a) {
  std::string s = std::to_string(a.stage) + op_name(a.op) + std::to_string(a.microbatch);
  if (a.is_send()) s += "->" + std::to_string(a.peer);
  if (a.is_recv()) s += "<-" + std::to_string(a.peer);
  return s;
}

std::ostream& operator<<(std::ostream& os, const Action& a) { return os << to_string(a); }

Action parse_action(std::string_view text) {
  Action a;
  size_t pos = 0;
  a.stage = read_number(text, pos);
  GPT2P_CHECK(a.stage >= 0, "action '" << text << "' does not start with a stage number",
              kActionForm);
  bool found = false;
  for (const auto& e : kOpNames) {
    const std::string_view name(e.name);
    if (text.substr(pos, name.size()) == name) {
      a.op = e.op;
      pos += name.size();
      found = true;
      break;
    }
  }
  GPT2P_CHECK(found, "action '" << text << "' has no known op after the stage number", kActionForm);
  a.microbatch = read_number(text, pos);
  GPT2P_CHECK(a.microbatch >= 0,
              "action '" << text << "' has no micro-batch number after " << op_name(a.op),
              kActionForm);
  if (!a.is_compute()) {
    const std::string_view arrow = a.is_send() ? "->" : "<-";
    GPT2P_CHECK(text.substr(pos, 2) == arrow,
                "action '" << text << "' needs '" << arrow << "peer' after the micro-batch",
                kActionForm);
    pos += 2;
    a.peer = read_number(text, pos);
    GPT2P_CHECK(a.peer >= 0, "action '" << text << "' has no peer stage after " << arrow,
                kActionForm);
  }
  GPT2P_CHECK(pos == text.size(),
              "action '" << text << "' has trailing text '" << text.substr(pos) << "'",
              kActionForm);
  return a;
}

std::string to_string(const RankActions& actions) {
  std::string s;
  for (const auto& a : actions) {
    if (!s.empty()) s += ' ';
    s += to_string(a);
  }
  return s;
}

RankActions parse_actions(std::string_view text) {
  RankActions out;
  size_t pos = 0;
  while (pos < text.size()) {
    while (pos < text.size() && std::isspace(static_cast<unsigned char>(text[pos])) != 0) ++pos;
    size_t end = pos;
    while (end < text.size() && std::isspace(static_cast<unsigned char>(text[end])) == 0) ++end;
    if (end > pos) out.push_back(parse_action(text.substr(pos, end - pos)));
    pos = end;
  }
  return out;
}

std::string to_string(const Schedule& schedule) {
  std::ostringstream os;
  for (size_t r = 0; r < schedule.size(); ++r) {
    os << "rank " << r << ": " << to_string(schedule[r]) << "\n";
  }
  return os.str();
}

Schedule gpipe_schedule(int n_microbatches, int n_stages) {
  check_sizes(n_microbatches, n_stages, "gpipe_schedule");
  Schedule schedule(n_stages);
  for (int s = 0; s < n_stages; ++s) {
    for (int i = 0; i < n_microbatches; ++i) schedule[s].push_back({Op::kForward, s, i, -1});
    for (int i = 0; i < n_microbatches; ++i) schedule[s].push_back({Op::kBackward, s, i, -1});
  }
  return schedule;
}

Schedule one_f_one_b_schedule(int n_microbatches, int n_stages) {
  check_sizes(n_microbatches, n_stages, "one_f_one_b_schedule");
  const int m = n_microbatches;
  Schedule schedule(n_stages);
  for (int s = 0; s < n_stages; ++s) {
    auto& list = schedule[s];
    const int warmup = std::min(m, n_stages - s - 1);
    for (int i = 0; i < warmup; ++i) list.push_back({Op::kForward, s, i, -1});
    for (int i = 0; i < m - warmup; ++i) {
      list.push_back({Op::kForward, s, warmup + i, -1});
      list.push_back({Op::kBackward, s, i, -1});
    }
    for (int i = m - warmup; i < m; ++i) list.push_back({Op::kBackward, s, i, -1});
  }
  return schedule;
}

Schedule interleaved_schedule(int n_microbatches, int n_ranks, int stages_per_rank) {
  check_sizes(n_microbatches, n_ranks, "interleaved_schedule");
  const int m = n_microbatches, R = n_ranks, V = stages_per_rank;
  GPT2P_CHECK(R >= 2, "interleaved_schedule: " << R << " rank",
              "interleave stages over at least 2 ranks (on one rank, run its layers as one stage)");
  GPT2P_CHECK(V >= 2, "interleaved_schedule: " << V << " stage(s) per rank",
              "interleave at least 2 stages per rank (1 is the plain 1F1B schedule)");
  GPT2P_CHECK(
      m % R == 0,
      "interleaved_schedule: " << m << " micro-batches are not a multiple of the " << R << " ranks",
      "use a number of micro-batches divisible by the number of ranks");
  const int total = m * V;
  // The k-th forward (backward) of every rank: (stage, micro-batch).
  const auto pick = [&](int k, bool forward, int r) {
    int chunk = (k / R) % V;
    if (!forward) chunk = V - 1 - chunk;
    return std::pair<int, int>{chunk * R + r, (k / (R * V)) * R + k % R};
  };
  Schedule schedule(R);
  for (int r = 0; r < R; ++r) {
    auto& list = schedule[r];
    const int warmup = m == R ? total : std::min(total, 2 * (R - r - 1) + (V - 1) * R);
    const auto add = [&](Op op, int k) {
      const auto [stage, mb] = pick(k, op == Op::kForward, r);
      list.push_back({op, stage, mb, -1});
    };
    for (int k = 0; k < warmup; ++k) add(Op::kForward, k);
    for (int i = 0; i < total - warmup; ++i) {
      add(Op::kForward, warmup + i);
      add(Op::kBackward, i);
    }
    for (int k = total - warmup; k < total; ++k) add(Op::kBackward, k);
  }
  return schedule;
}

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

Schedule zero_bubble_schedule(const Schedule& base, const ZeroBubbleCosts& costs) {
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
  };
  std::vector<RankState> state(R);
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
      const Action w = rs.pending.front();
      rs.pending.pop_front();
      rs.now += costs.weight_backward[w.stage];
      out[pick].push_back(w);
    };
    if (rs.pc == base[pick].size()) {
      run_oldest_w();  // after the last base action: the rest, oldest first
      continue;
    }
    const Action& a = base[pick][rs.pc];
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

Schedule add_communication(const Schedule& compute, int n_stages) {
  const int R = static_cast<int>(compute.size());
  GPT2P_CHECK(R >= 1 && n_stages >= R && n_stages % R == 0,
              "add_communication: the schedule has " << R << " ranks but n_stages = " << n_stages,
              "pass one action list per rank, for a number of stages that is a multiple of it");
  Schedule out(R);
  for (int r = 0; r < R; ++r) {
    for (const Action& a : compute[r]) {
      GPT2P_CHECK(a.is_compute(),
                  "add_communication: rank " << r << " already holds '" << to_string(a) << "'",
                  "pass a compute-only schedule (F, B and W actions), e.g. from gpipe_schedule");
      const int s = a.stage;
      GPT2P_CHECK(
          s >= 0 && s < n_stages && rank_of_stage(s, R) == r,
          "add_communication: rank " << r << " holds '" << to_string(a) << "' of stage " << s,
          "put the actions of stage s in list number s % <ranks>");
      const int mb = a.microbatch;
      if (a.op == Op::kWeight) {
        out[r].push_back(a);  // only its own B's saved tensors: nothing to send or receive
      } else if (a.op == Op::kForward) {
        if (s > 0) out[r].push_back({Op::kRecvActivation, s, mb, s - 1});
        out[r].push_back(a);
        if (s < n_stages - 1) out[r].push_back({Op::kSendActivation, s, mb, s + 1});
      } else {
        if (s < n_stages - 1) out[r].push_back({Op::kRecvGrad, s, mb, s + 1});
        out[r].push_back(a);
        if (s > 0) out[r].push_back({Op::kSendGrad, s, mb, s - 1});
      }
    }
  }
  return out;
}

Channel channel_of(const Action& a, int n_ranks) {
  GPT2P_CHECK(!a.is_compute(), "channel_of: '" << to_string(a) << "' is no transfer",
              "ask for the channel of a SEND_* or RECV_* action");
  const bool activation = a.op == Op::kSendActivation || a.op == Op::kRecvActivation;
  const int from = a.is_send() ? a.stage : a.peer;
  const int to = a.is_send() ? a.peer : a.stage;
  // Activations normally go to a higher rank and gradients to a lower one; the other way wraps.
  const int from_rank = rank_of_stage(from, n_ranks), to_rank = rank_of_stage(to, n_ranks);
  const bool wraps = activation ? to_rank <= from_rank : to_rank >= from_rank;
  if (activation) return wraps ? Channel::kActivationsWrap : Channel::kActivations;
  return wraps ? Channel::kGradientsWrap : Channel::kGradients;
}

ScheduleKind parse_schedule_kind(const std::string& name) {
  if (name == "gpipe") return ScheduleKind::kGPipe;
  if (name == "1f1b") return ScheduleKind::kOneFOneB;
  if (name == "interleaved") return ScheduleKind::kInterleaved;
  GPT2P_FAIL("unknown pipeline schedule '" << name << "'", "use one of: gpipe, 1f1b, interleaved");
}

std::string to_string(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGPipe:
      return "gpipe";
    case ScheduleKind::kOneFOneB:
      return "1f1b";
    case ScheduleKind::kInterleaved:
      break;
  }
  return "interleaved";
}

Schedule make_schedule(ScheduleKind kind, int n_microbatches, int n_ranks, int stages_per_rank) {
  if (kind == ScheduleKind::kInterleaved) {
    return add_communication(interleaved_schedule(n_microbatches, n_ranks, stages_per_rank),
                             n_ranks * stages_per_rank);
  }
  GPT2P_CHECK(stages_per_rank == 1,
              to_string(kind) << " runs one stage per rank, not " << stages_per_rank,
              "use --schedule interleaved for several stages per rank");
  const Schedule compute = kind == ScheduleKind::kGPipe
                               ? gpipe_schedule(n_microbatches, n_ranks)
                               : one_f_one_b_schedule(n_microbatches, n_ranks);
  return add_communication(compute, n_ranks);
}

}  // namespace gpt2p::pipeline
