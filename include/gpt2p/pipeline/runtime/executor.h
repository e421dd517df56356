// The pipeline executor: one rank, its stages (one, or V with the interleaved schedule: stage
// rank + c R for c = 0..V-1) and one action list (schedule.h's make_schedule()[rank]).
//
// It interprets the list in order and holds no scheduling logic:
//   SEND_* / RECV_*  posted asynchronously on their channel (schedule.h's channel_of) to the rank
//                    of the peer stage; a receive is waited for by the F / B that needs it
//   F                runs the action's stage; keeps the input (requires_grad on non-first stages)
//                    and output, per (stage, micro-batch)
//   SEND_F / SEND_B  post an asynchronous send of the output / the input's gradient; the sends are
//                    waited for at the end of the step (their buffers stay alive until then)
//   B                loss.backward() on the last stage, backward({output}, {grad}) elsewhere;
//                    gradients accumulate over the micro-batches
// A forward-only list (make_forward_only_schedule, Pass::kForwardOnly: evaluation) runs under
// torch::NoGradGuard: F's input is not marked requires_grad and nothing is kept for a backward,
// only the output until its SEND_F has been posted (the last stage's not at all).
// Transfers go through a Transport, so tests can run a stage with a recording fake and no MPI.
// Channels: NCCL queues point-to-point calls on a communicator's one stream, each waiting there for
// its partner, so activations and gradients sharing a stream can deadlock (1F1B: stage 0 sends
// F1 while stage 1 sends B0; simulator.h, Transfers::kOneStream). Grouping the pair into one NCCL
// group was seen on 2xH200 to hang GPipe and model_parallel (a group's receive held back its
// send). One communicator per channel (two, plus two "wrap" channels when stages interleave)
// keeps each stream one-directional between any two ranks and in the same order on both sides,
// which cannot deadlock for any schedule the simulator accepts (Transfers::kStreamPerDirection).
// Waits order torch's stream after the transfer without blocking the host.
//
// Timing: every action gets a start and end mark on a compat::DeviceClock (CUDA events on GPUs,
// host clock on CPUs) read once at the end of the step.
#pragma once

#include <torch/types.h>

#include <map>
#include <memory>
#include <vector>

#include "gpt2p/comm/communicator.h"
#include "gpt2p/compat/device.h"
#include "gpt2p/io/run_record.h"
#include "gpt2p/pipeline/plan/schedule.h"
#include "gpt2p/pipeline/runtime/stage.h"

namespace gpt2p::pipeline {

// Point-to-point transfers of one rank. post() starts one transfer on a channel (op.peer is a
// rank) and returns at once with the Work to wait on.
class Transport {
 public:
  virtual ~Transport() = default;
  virtual comm::WorkPtr post(comm::P2POp& op, Channel channel) = 0;
};

// One Communicator per channel (tag 0: messages match in call order per pair). Several channels
// may share one object for backends whose calls never block (MPI). The wrap channels are needed
// only by interleaved schedules; without them such a transfer throws.
class CommTransport : public Transport {
 public:
  CommTransport(comm::Communicator& activations, comm::Communicator& gradients,
                comm::Communicator* activations_wrap = nullptr,
                comm::Communicator* gradients_wrap = nullptr)
      : comms_{&activations, &gradients, activations_wrap, gradients_wrap} {}
  comm::WorkPtr post(comm::P2POp& op, Channel channel) override;

 private:
  comm::Communicator* comms_[kNumChannels];
};

struct StepTimes {
  double forward = 0, backward = 0;  // seconds of stage compute
  double comm_wait = 0;              // seconds spent waiting for receives and sends
  int max_live_activations = 0;      // most (stage, micro-batch) activations kept at once
  std::vector<io::ActionRecord> actions;
};

// What a list is run for: a training step (F, B, maybe W, transfers both ways), or forward only
// (F, SEND_F and RECV_F alone; see above).
enum class Pass { kTraining, kForwardOnly };

class Executor {
 public:
  // `stages[c]` runs stage rank + c * n_ranks; `actions` must be this rank's list (every action's
  // stage one of those; with Pass::kForwardOnly, no B, W, SEND_B or RECV_B).
  Executor(std::vector<Stage*> stages, Transport& transport, RankActions actions, int rank,
           int n_ranks, const torch::Device& device, Pass pass = Pass::kTraining);
  // One stage per rank: stage `rank` of n_ranks.
  Executor(Stage& stage, Transport& transport, RankActions actions, int rank, int n_ranks,
           const torch::Device& device, Pass pass = Pass::kTraining)
      : Executor(std::vector<Stage*>{&stage}, transport, std::move(actions), rank, n_ranks, device,
                 pass) {}

  // Runs the list once. Action records get `step` and times in seconds since the run started,
  // given that the step started `step_start` seconds after it (host clock).
  StepTimes run_step(long long step, double step_start);

  const RankActions& actions() const { return actions_; }

 private:
  using Key = std::pair<int, int>;  // (stage, micro-batch)
  struct Pending {
    torch::Tensor buffer;
    comm::WorkPtr work;
    size_t record = 0;  // index of the RECV action's record
  };
  struct Stash {
    torch::Tensor input, output;
  };
  int mark();
  Stage& stage_of(int stage) { return *stages_[static_cast<size_t>(stage / n_ranks_)]; }
  torch::Tensor wait_recv(std::map<Key, Pending>& pending, Key key, const char* what,
                          std::vector<std::pair<int, int>>& waits);

  std::vector<Stage*> stages_;
  Transport& transport_;
  RankActions actions_;
  int rank_;
  int n_ranks_;
  Pass pass_;
  compat::DeviceClock clock_;
  int next_mark_ = 0;
};

}  // namespace gpt2p::pipeline
