#include "gpt2p/pipeline/plan/schedule.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <sstream>

#include "gpt2p/core/error.h"
#include "schedule_table.h"

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

Schedule forward_only_schedule(int n_microbatches, int n_ranks, int stages_per_rank) {
  check_sizes(n_microbatches, n_ranks, "forward_only_schedule");
  GPT2P_CHECK(stages_per_rank >= 1,
              "forward_only_schedule: " << stages_per_rank << " stage(s) per rank",
              "run at least one stage per rank");
  GPT2P_CHECK(n_ranks >= 2 || stages_per_rank == 1,
              "forward_only_schedule: " << stages_per_rank << " stages on 1 rank",
              "on one rank, run its layers as one stage (a rank sends nothing to itself)");
  Schedule schedule(n_ranks);
  for (int r = 0; r < n_ranks; ++r) {
    for (int c = 0; c < stages_per_rank; ++c) {
      for (int i = 0; i < n_microbatches; ++i) {
        schedule[r].push_back({Op::kForward, r + c * n_ranks, i, -1});
      }
    }
  }
  return schedule;
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

const ScheduleInfo& schedule_info(ScheduleKind kind) {
  for (const ScheduleInfo& s : kSchedules) {
    if (s.kind == kind) return s;
  }
  GPT2P_FAIL("schedule_info: schedule kind " << static_cast<int>(kind) << " has no row",
             "pass a ScheduleKind of kSchedules (schedule.h)");
}

std::string schedule_names(bool several_stages_per_rank) {
  std::string out;
  for (const ScheduleInfo& s : kSchedules) {
    if (s.several_stages_per_rank != several_stages_per_rank) continue;
    out += (out.empty() ? "" : " and ") + std::string(s.name);
  }
  return out;
}

void detail::check_stages_per_rank(const ScheduleInfo& schedule, int stages_per_rank) {
  if (schedule.several_stages_per_rank || stages_per_rank == 1) return;
  std::string several;  // the kinds that take it, "a or b"
  for (const ScheduleInfo& s : kSchedules) {
    if (s.several_stages_per_rank) several += (several.empty() ? "" : " or ") + std::string(s.name);
  }
  GPT2P_FAIL(schedule.name << " runs one stage per rank, not " << stages_per_rank,
             "use --schedule " << several << " for several stages per rank");
}

Schedule make_schedule(ScheduleKind kind, int n_microbatches, int n_ranks, int stages_per_rank) {
  const ScheduleInfo& schedule = schedule_info(kind);
  detail::check_stages_per_rank(schedule, stages_per_rank);
  return add_communication(schedule.compute(n_microbatches, n_ranks, stages_per_rank),
                           n_ranks * stages_per_rank);
}

Schedule make_forward_only_schedule(int n_microbatches, int n_ranks, int stages_per_rank) {
  return add_communication(forward_only_schedule(n_microbatches, n_ranks, stages_per_rank),
                           n_ranks * stages_per_rank);
}

}  // namespace gpt2p::pipeline
