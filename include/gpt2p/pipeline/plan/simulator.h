// Dry runs of a pipeline schedule: rule checks (validate) and a timing simulation (simulate).
//
// Both take a schedule with communication (schedule.h, add_communication) where rank r runs
// stage r. Neither needs MPI, a GPU or torch, so every plan can be checked in a unit test before
// an executor runs it.
//
// Simulation semantics:
//  * every rank executes its list strictly in order, one action at a time;
//  * F, B and W take forward[s] / backward[s] / weight[s] time units on stage s (W: the weight
//    gradients of a split backward, schedule.h; it needs only its own B, earlier in the list);
//  * transfers follow one of three models (Transfers below):
//    - kBuffered (MPI, whose sends never wait): a SEND is issued and completes at once; a RECV
//      completes when the matching SEND (same kind, micro-batch, from, to; FIFO among equal ones)
//      has been issued, at max(now, send time + comm); until then the rank waits;
//    - kOneStream (NCCL, every transfer of a rank on one stream): the rank's compute runs in list
//      order, each F/B after the receive it needs; a transfer is posted on the stream once the
//      previous transfer there has ended and the compute listed before it has ended (the event
//      the executor records), and it ends comm after both it and its partner are posted;
//    - kStreamPerDirection (what pp_train does on GPUs): the same with one stream for activations
//      and one for gradients;
//  * when no rank can progress and some have actions left, the plan deadlocks: the result names
//    each stuck rank, the action it waits at, and where its peer is.
#pragma once

#include <string>
#include <vector>

#include "gpt2p/pipeline/plan/schedule.h"

namespace gpt2p::pipeline {

// Costs for the simulation. Empty forward/backward mean 1 and 2 on every stage (the usual
// backward = 2 x forward); otherwise they hold one entry per stage. comm is added to every
// transfer (time from SEND to the earliest matching RECV completion).
struct SimCosts {
  std::vector<double> forward;
  std::vector<double> backward;  // with W actions in the schedule: the input-gradient part (B)
  std::vector<double> weight;    // W actions; empty means 1 on every stage
  double comm = 0.0;
};

enum class Transfers { kBuffered, kOneStream, kStreamPerDirection };

struct ActionTiming {
  double start = 0.0;
  double end = 0.0;
};

struct SimResult {
  bool ok = false;              // every rank ran its whole list
  std::string deadlock_reason;  // empty when ok; else one line per stuck rank
  double makespan = 0.0;        // when the last rank finished its last action
  // 1 - sum(busy) / (n_ranks * makespan); idle time of all ranks over the whole step.
  double bubble_fraction = 0.0;
  std::vector<double> busy;  // per rank: time spent in F, B and W
  // per rank: max (#F done - #B done) over its list; with W actions, #F done - #W done (the
  // inputs a deferred W still needs stay alive until it runs); 0 for a list without B (forward
  // only: its F's keep nothing for a backward)
  std::vector<int> max_live_activations;
  // Per rank, per executed action (parallel to the schedule; shorter lists on deadlock).
  std::vector<std::vector<ActionTiming>> timings;
};

// Runs the plan. Throws gpt2p::Error only for bad costs (wrong sizes, negative values); plan
// mistakes show up as !ok with a reason (deadlock) or as violations from validate().
SimResult simulate(const Schedule& schedule, const SimCosts& costs = {},
                   Transfers transfers = Transfers::kBuffered);

struct ValidateOptions {
  // Check the send/recv rules (off for compute-only schedules).
  bool check_communication = true;
  // 1F1B's memory rule: at most min(m, n - s) activations alive on stage s.
  bool limit_live_activations = false;
  // A forward-only schedule (make_forward_only_schedule): every micro-batch forwarded once per
  // stage, with its activation transfers, and no B, W, SEND_B or RECV_B at all.
  bool forward_only = false;
};

// Checks a schedule for m micro-batches on n stages and returns every violation found, one
// human-readable line each (empty = valid):
//  * n lists; every action of list r has stage r, micro-batch in [0, m), peer -1 for F/B;
//  * every micro-batch is forwarded and backwarded exactly once per stage, F before B (with
//    forward_only: forwarded exactly once, and no backward work);
//  * W actions (split backwards): either none at all, or exactly one per B, after that B on the
//    same stage;
//  * with communication: sends and receives go to the adjacent stage in the right direction
//    (SEND_F/RECV_B with s+1, RECV_F/SEND_B with s-1); every (kind, micro-batch, from, to) is sent
//    exactly once and received exactly once; RECV_F before F and RECV_B before B on the stage that
//    uses them, and SEND_F after F, SEND_B after B on the stage that produces them;
//  * with limit_live_activations: the 1F1B bound above.
std::vector<std::string> validate(const Schedule& schedule, int n_microbatches, int n_stages,
                                  const ValidateOptions& options = {});

}  // namespace gpt2p::pipeline
