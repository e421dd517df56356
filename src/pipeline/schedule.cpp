#include "gpt2p/pipeline/schedule.h"

#include <algorithm>
#include <array>
#include <cctype>
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
constexpr std::array<OpName, 6> kOpNames{{{Op::kSendActivation, "SEND_F"},
                                          {Op::kRecvActivation, "RECV_F"},
                                          {Op::kSendGrad, "SEND_B"},
                                          {Op::kRecvGrad, "RECV_B"},
                                          {Op::kForward, "F"},
                                          {Op::kBackward, "B"}}};

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
    "write <stage><op><microbatch>[->peer|<-peer] with op one of F, B, SEND_F, RECV_F, SEND_B, "
    "RECV_B, e.g. 2F0, 1B3, 0SEND_F1->1, 1RECV_F1<-0";

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

Schedule add_communication(const Schedule& compute, int n_stages) {
  GPT2P_CHECK(static_cast<int>(compute.size()) == n_stages,
              "add_communication: the schedule has " << compute.size()
                                                     << " ranks but n_stages = " << n_stages,
              "pass one action list per stage");
  Schedule out(n_stages);
  for (int s = 0; s < n_stages; ++s) {
    for (const Action& a : compute[s]) {
      GPT2P_CHECK(a.is_compute(),
                  "add_communication: rank " << s << " already holds '" << to_string(a) << "'",
                  "pass a compute-only schedule (F and B actions), e.g. from gpipe_schedule");
      GPT2P_CHECK(
          a.stage == s,
          "add_communication: rank " << s << " holds '" << to_string(a) << "' of stage " << a.stage,
          "put each stage's actions in list number <stage>");
      const int mb = a.microbatch;
      if (a.op == Op::kForward) {
        if (s > 0) out[s].push_back({Op::kRecvActivation, s, mb, s - 1});
        out[s].push_back(a);
        if (s < n_stages - 1) out[s].push_back({Op::kSendActivation, s, mb, s + 1});
      } else {
        if (s < n_stages - 1) out[s].push_back({Op::kRecvGrad, s, mb, s + 1});
        out[s].push_back(a);
        if (s > 0) out[s].push_back({Op::kSendGrad, s, mb, s - 1});
      }
    }
  }
  return out;
}

ScheduleKind parse_schedule_kind(const std::string& name) {
  if (name == "gpipe") return ScheduleKind::kGPipe;
  if (name == "1f1b") return ScheduleKind::kOneFOneB;
  GPT2P_FAIL("unknown pipeline schedule '" << name << "'", "use one of: gpipe, 1f1b");
}

std::string to_string(ScheduleKind kind) { return kind == ScheduleKind::kGPipe ? "gpipe" : "1f1b"; }

Schedule make_schedule(ScheduleKind kind, int n_microbatches, int n_stages) {
  const Schedule compute = kind == ScheduleKind::kGPipe
                               ? gpipe_schedule(n_microbatches, n_stages)
                               : one_f_one_b_schedule(n_microbatches, n_stages);
  return add_communication(compute, n_stages);
}

}  // namespace gpt2p::pipeline
