// Pipeline schedules as plain values: clock cycles (GPipe's table) and per-rank action lists.
//
// Nothing here runs anything. An executor walks a rank's action list in order; the simulator
// (simulator.h) dry-runs all ranks' lists to check the plan and predict its bubble.
//
// clock_cycles(m, n) for m micro-batches on n stages: m + n - 1 ticks; tick k holds every
// (micro-batch i, stage j) with i + j == k, ordered by increasing stage j. For m = 3, n = 3:
//
//            stage 0   stage 1   stage 2
//   tick 0   (0,0)
//   tick 1   (1,0)     (0,1)
//   tick 2   (2,0)     (1,1)     (0,2)
//   tick 3             (2,1)     (1,2)
//   tick 4                       (2,2)
//
// Action lists: one per rank. With R ranks and S = R * V stages, rank r runs stages r, r + R,
// r + 2R, ... (V = 1: rank r runs stage r; V > 1: the interleaved schedule's "virtual stages",
// which cut the bubble V-fold at the same micro-batch size). Each action names its stage and prints
// as in torch.distributed.pipelining, with the peer stage of send/recv appended:
//
//   "2F0"        stage 2, forward of micro-batch 0
//   "1B3"        stage 1, backward of micro-batch 3 (with W actions: its input gradient only)
//   "1W3"        stage 1, weight gradients of micro-batch 3 (zero-bubble schedules, zero_bubble.h)
//   "0SEND_F1->1"  stage 0 sends the activation of micro-batch 1 to stage 1
//   "1RECV_F1<-0"  stage 1 receives the activation of micro-batch 1 from stage 0
//   "1SEND_B1->0"  stage 1 sends the input gradient of micro-batch 1 to stage 0
//   "0RECV_B1<-1"  stage 0 receives that gradient from stage 1
//
// Schedules are built in two passes, as torch does: a compute-only list (F and B actions) per
// rank, then add_communication() inserts the sends and receives around them.
#pragma once

#include <array>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "gpt2p/core/names.h"
#include "gpt2p/io/action_ops.h"

namespace gpt2p::pipeline {

// One cell of the clock-cycle table: micro-batch `microbatch` runs on stage `stage`.
struct Cell {
  int microbatch = 0;
  int stage = 0;
  bool operator==(const Cell& o) const { return microbatch == o.microbatch && stage == o.stage; }
};
std::ostream& operator<<(std::ostream& os, const Cell& c);  // "(i,j)"

// The m + n - 1 ticks of GPipe's forward pass (see the table above). m >= 1, n >= 1.
std::vector<std::vector<Cell>> clock_cycles(int n_microbatches, int n_stages);

// The rank that runs `stage` when R = n_ranks ranks share the stages round-robin.
inline int rank_of_stage(int stage, int n_ranks) { return stage % n_ranks; }

struct Action {
  // The values are the timing files' op codes (io/action_ops.h), which also has the optimizer's.
  // kWeight: the weight-gradient half of a backward split in two (zero_bubble.h);
  // in a schedule that has W actions, B computes only the gradient of the stage's input.
  enum class Op {
    kForward = static_cast<int>(io::ActionOp::kForward),
    kBackward = static_cast<int>(io::ActionOp::kBackward),
    kSendActivation = static_cast<int>(io::ActionOp::kSendActivation),
    kRecvActivation = static_cast<int>(io::ActionOp::kRecvActivation),
    kSendGrad = static_cast<int>(io::ActionOp::kSendGrad),
    kRecvGrad = static_cast<int>(io::ActionOp::kRecvGrad),
    kWeight = static_cast<int>(io::ActionOp::kWeight),
  };
  Op op = Op::kForward;
  int stage = 0;  // the stage it belongs to; rank_of_stage(stage, R) executes it
  int microbatch = 0;
  int peer = -1;  // the other stage of a send/recv; -1 for F and B

  bool is_compute() const { return op == Op::kForward || op == Op::kBackward || op == Op::kWeight; }
  bool is_send() const { return op == Op::kSendActivation || op == Op::kSendGrad; }
  bool is_recv() const { return op == Op::kRecvActivation || op == Op::kRecvGrad; }
  bool operator==(const Action& o) const {
    return op == o.op && stage == o.stage && microbatch == o.microbatch && peer == o.peer;
  }
  bool operator!=(const Action& o) const { return !(*this == o); }
};

// Per rank, the actions in execution order. schedule[r] holds only actions of stages s with
// rank_of_stage(s, schedule.size()) == r.
using RankActions = std::vector<Action>;
using Schedule = std::vector<RankActions>;

// "2F0", "1B3", "0SEND_F1->1", "1RECV_F1<-0", "1SEND_B1->0", "0RECV_B1<-1" (see above).
std::string to_string(const Action& a);
std::ostream& operator<<(std::ostream& os, const Action& a);
// Inverse of to_string; throws gpt2p::Error naming the text and the expected form.
Action parse_action(std::string_view text);

// Space-separated actions, e.g. "0F0 0SEND_F0->1 0F1"; parse_actions accepts any whitespace.
std::string to_string(const RankActions& actions);
RankActions parse_actions(std::string_view text);
// One line per rank: "rank 0: 0F0 0SEND_F0->1 ...".
std::string to_string(const Schedule& schedule);

// Compute-only schedules (F and B actions), one list per stage.
//
// GPipe (torch.distributed.pipelining's ScheduleGPipe order): every stage runs the forwards of
// micro-batches 0..m-1, then the backwards in the same order 0..m-1. All m activations are alive
// on every stage at the turn.
Schedule gpipe_schedule(int n_microbatches, int n_stages);

// 1F1B (PipeDream-flush / Megatron / torch's Schedule1F1B): stage s runs
//   warm-up:   w = min(m, n - s - 1) forwards F0..F(w-1)
//   steady:    for i in 0..m-w-1: F(w+i), then B(i)
//   cool-down: the remaining backwards B(m-w)..B(m-1)
// so at most min(m, n - s) activations are alive on stage s at any time.
Schedule one_f_one_b_schedule(int n_microbatches, int n_stages);

// Interleaved 1F1B (Megatron-LM's virtual pipeline, torch's ScheduleInterleaved1F1B): R ranks,
// V >= 2 stages per rank (rank r runs stages r, r + R, ...), m micro-batches with m % R == 0.
// Every rank walks the same order of (chunk, micro-batch) pairs: forward k (0 <= k < m V) is
// micro-batch (k / (R V)) R + k % R of its chunk (k / R) % V; backward k the same micro-batch of
// chunk V - 1 - (k / R) % V. Rank r runs w = min(m V, 2 (R - r - 1) + (V - 1) R) forwards first
// (all m V when m == R), then alternates F(w + i), B(i), then the remaining backwards. The bubble
// is (R - 1) / V stage-times instead of 1F1B's R - 1, for up to w + 1 activations alive per rank.
Schedule interleaved_schedule(int n_microbatches, int n_ranks, int stages_per_rank);

// Forward only, for evaluation (torch.distributed.pipelining's _ScheduleForwardOnly): every stage
// forwards micro-batches 0..m-1 in order and runs nothing else. Rank r runs its stages r, r + R,
// ... one after the other (all m forwards of stage r, then those of stage r + R, ...), so every
// activation channel carries its transfers in the same order on both sides, as in GPipe. Any
// m >= 1 and R >= 1 with V >= 1 (V >= 2 only on R >= 2: a rank sends nothing to itself). Not a
// training schedule: no row in kSchedules, no --schedule choice.
Schedule forward_only_schedule(int n_microbatches, int n_ranks, int stages_per_rank = 1);

// Inserts the point-to-point actions into a compute-only schedule of n stages on R =
// compute.size() ranks (each transfer names the peer stage; ranks follow rank_of_stage):
//   before F at s > 0:      RECV_F from s-1      after F at s < n-1:  SEND_F to s+1
//   before B at s < n-1:    RECV_B from s+1      after B at s > 0:    SEND_B to s-1
// (W actions need no transfer; they stay where they are.)
// Throws if the input already holds send/recv actions, n is not a multiple of R, or a rank's list
// names a stage that another rank runs.
Schedule add_communication(const Schedule& compute, int n_stages);

// The link a transfer travels on. Activations go to the next stage, gradients to the previous
// one; with V > 1 stages per rank, the step from the last rank back to rank 0 (activations) and
// from rank 0 to the last rank (gradients) "wraps" around. Each channel is its own communicator
// (own NCCL stream) in pp_train, so every stream carries transfers between any two ranks in one
// direction only, in the same micro-batch order on both sides (see executor.h).
enum class Channel { kActivations, kGradients, kActivationsWrap, kGradientsWrap };
constexpr int kNumChannels = 4;
// The channel of a SEND_* / RECV_* action on R ranks; throws for F and B.
Channel channel_of(const Action& a, int n_ranks);

// --schedule: the schedule kinds, one row each in kSchedules. Adding a schedule is an enumerator,
// its row and its compute-only generator: make_schedule, make_zero_bubble_schedule (zero_bubble.h),
// the planner (perf/planner.h) and the command line all go through the table.
enum class ScheduleKind { kGPipe, kOneFOneB, kInterleaved };
struct ScheduleInfo {
  ScheduleKind kind;
  std::string_view name;  // the --schedule value
  // false: one stage per rank (stages_per_rank 1). true: V >= 2 stages per rank (rank r runs
  // stages r, r + R, ...) on R >= 2 ranks, with the micro-batches a multiple of R.
  bool several_stages_per_rank;
  // The compute-only schedule (F and B actions) of m micro-batches on R ranks x V stages per rank.
  Schedule (*compute)(int n_microbatches, int n_ranks, int stages_per_rank);
};
inline constexpr std::array<ScheduleInfo, 3> kSchedules{{
    {ScheduleKind::kGPipe, "gpipe", false,
     [](int m, int n_ranks, int v) { return gpipe_schedule(m, n_ranks * v); }},
    {ScheduleKind::kOneFOneB, "1f1b", false,
     [](int m, int n_ranks, int v) { return one_f_one_b_schedule(m, n_ranks * v); }},
    {ScheduleKind::kInterleaved, "interleaved", true, interleaved_schedule},
}};
// The row of `kind`; throws gpt2p::Error for a value that has none.
const ScheduleInfo& schedule_info(ScheduleKind kind);
// The names of the kinds that run several stages per rank (true) or one (false): "a and b".
std::string schedule_names(bool several_stages_per_rank);

constexpr std::array<Named<ScheduleKind>, kSchedules.size()> names(ScheduleKind) {
  // Made at compile time: the names alone, without the generators (no link to them needed).
  constexpr auto table = [] {
    std::array<Named<ScheduleKind>, kSchedules.size()> out{};
    for (size_t i = 0; i < out.size(); ++i) out[i] = {kSchedules[i].kind, kSchedules[i].name};
    return out;
  }();
  return table;
}
inline std::string to_string(ScheduleKind kind) { return name_string(kind); }
// The compute schedule of `kind` with communication added: what executors run, one list per rank.
// Kinds with one stage per rank take stages_per_rank 1; the others (interleaved) take >= 2
// (n_ranks * stages_per_rank stages).
Schedule make_schedule(ScheduleKind kind, int n_microbatches, int n_ranks, int stages_per_rank = 1);
// forward_only_schedule with communication (RECV_F before each F past stage 0, SEND_F after each F
// before the last stage): what an executor runs forward only (executor.h, Pass::kForwardOnly).
Schedule make_forward_only_schedule(int n_microbatches, int n_ranks, int stages_per_rank = 1);

}  // namespace gpt2p::pipeline
