#include "gpt2p/pipeline/runtime/executor.h"

#include <algorithm>
#include <optional>

#include "gpt2p/core/error.h"

namespace gpt2p::pipeline {
namespace {

long long bytes_of(const torch::Tensor& t) {
  return static_cast<long long>(t.numel()) * static_cast<long long>(t.element_size());
}

}  // namespace

comm::WorkPtr CommTransport::post(comm::P2POp& op, Channel channel) {
  comm::Communicator* comm = comms_[static_cast<int>(channel)];
  GPT2P_CHECK(comm != nullptr,
              "a pipeline transfer to rank " << op.peer << " wraps from the last rank to the first"
                                             << " but this transport has no wrap channels",
              "give CommTransport its two wrap communicators for interleaved schedules");
  return op.kind == comm::P2POp::Kind::kSend ? comm->send_async(op.tensor, op.peer, op.tag)
                                             : comm->recv_async(op.tensor, op.peer, op.tag);
}

Executor::Executor(std::vector<Stage*> stages, Transport& transport, RankActions actions, int rank,
                   int n_ranks, const torch::Device& device, Pass pass)
    : stages_(std::move(stages)),
      transport_(transport),
      actions_(std::move(actions)),
      rank_(rank),
      n_ranks_(n_ranks),
      pass_(pass),
      clock_(device, 4 * static_cast<int>(actions_.size()) + 2) {
  GPT2P_CHECK(n_ranks_ >= 1 && rank_ >= 0 && rank_ < n_ranks_ && !stages_.empty(),
              "executor of rank " << rank_ << " of " << n_ranks_ << " with " << stages_.size()
                                  << " stage(s)",
              "pass 0 <= rank < n_ranks and at least one stage");
  for (const auto& a : actions_) {
    GPT2P_CHECK(rank_of_stage(a.stage, n_ranks_) == rank_ &&
                    a.stage / n_ranks_ < static_cast<int>(stages_.size()),
                "action " << to_string(a) << " is for stage " << a.stage
                          << " but the executor of rank " << rank_ << " runs " << stages_.size()
                          << " stage(s) from stage " << rank_ << " in steps of " << n_ranks_,
                "pass make_schedule(...)[rank] to the executor of that rank");
    GPT2P_CHECK(pass_ == Pass::kTraining || a.op == Action::Op::kForward ||
                    a.op == Action::Op::kSendActivation || a.op == Action::Op::kRecvActivation,
                "action " << to_string(a) << " is backward work but the executor of rank " << rank_
                          << " runs forward only",
                "pass make_forward_only_schedule(...)[rank] to a forward-only executor");
  }
}

int Executor::mark() {
  clock_.mark(next_mark_);
  return next_mark_++;
}

torch::Tensor Executor::wait_recv(std::map<Key, Pending>& pending, Key key, const char* what,
                                  std::vector<std::pair<int, int>>& waits) {
  auto it = pending.find(key);
  GPT2P_CHECK(it != pending.end(),
              "stage " << key.first << " needs the " << what << " of micro-batch " << key.second
                       << " but no receive for it was posted before",
              "the action list must hold the RECV before its use (build it with make_schedule)");
  const int a = mark();
  it->second.work->wait();
  const int b = mark();
  waits.emplace_back(a, b);
  auto buffer = std::move(it->second.buffer);
  pending.erase(it);
  return buffer;
}

StepTimes Executor::run_step(long long step, double step_start) {
  const bool forward_only = pass_ == Pass::kForwardOnly;
  std::optional<torch::NoGradGuard> no_grad;
  if (forward_only) no_grad.emplace();
  next_mark_ = 0;
  const int origin = mark();
  struct Span {
    int start, end;
  };
  std::vector<Span> spans;             // per record: marks of the action
  std::vector<io::ActionRecord> recs;  // times filled in at the end
  std::vector<std::pair<int, int>> waits;
  std::map<Key, Pending> recv_act, recv_grad;
  std::map<Key, Stash> stash;
  std::map<Key, torch::Tensor> input_grads;
  std::vector<std::pair<comm::WorkPtr, torch::Tensor>> sends;
  std::vector<int> forward_spans, backward_spans;
  StepTimes times;

  // Posts one transfer of action `a` on its channel; `record` is the index of its record.
  auto post = [&](const Action& a, torch::Tensor tensor, size_t record) -> comm::WorkPtr {
    const bool recv = a.is_recv();
    comm::P2POp op{recv ? comm::P2POp::Kind::kRecv : comm::P2POp::Kind::kSend, std::move(tensor),
                   rank_of_stage(a.peer, n_ranks_)};
    const int s = mark();
    auto work = transport_.post(op, channel_of(a, n_ranks_));
    spans[record] = {s, recv ? s : mark()};  // recv: end on use
    return work;
  };

  for (const auto& a : actions_) {
    io::ActionRecord rec;
    rec.step = step;
    rec.stage = a.stage;
    rec.op = static_cast<int>(a.op);
    rec.microbatch = a.microbatch;
    const Key key{a.stage, a.microbatch};
    Stage& stage = stage_of(a.stage);
    auto need_stash = [&](const char* why) -> Stash& {
      auto it = stash.find(key);
      GPT2P_CHECK(it != stash.end(),
                  "stage " << a.stage << " runs " << to_string(a) << " (" << why
                           << ") but micro-batch " << a.microbatch << " has no forward pending",
                  "every F must come before its SEND_F, RECV_B and B in the action list");
      return it->second;
    };
    switch (a.op) {
      case Action::Op::kRecvActivation:
      case Action::Op::kRecvGrad: {
        const bool act = a.op == Action::Op::kRecvActivation;
        auto& pending = act ? recv_act : recv_grad;
        GPT2P_CHECK(pending.count(key) == 0,
                    "stage " << a.stage << " posts " << to_string(a) << " twice",
                    "each micro-batch is received once per direction");
        torch::Tensor buffer = act ? stage.empty_activation(a.microbatch)
                                   : torch::empty_like(need_stash("gradient buffer").output);
        rec.bytes_recv = bytes_of(buffer);
        const size_t r = recs.size();
        spans.push_back({0, 0});
        recs.push_back(rec);
        pending[key] = Pending{buffer, post(a, buffer, r), r};
        continue;
      }
      case Action::Op::kForward: {
        GPT2P_CHECK(stash.count(key) == 0,
                    "stage " << a.stage << " runs " << to_string(a) << " twice",
                    "each micro-batch runs forward once per step");
        torch::Tensor input;
        if (stage.is_first()) {
          input = stage.input(a.microbatch);
        } else {
          const size_t r = recv_act.count(key) ? recv_act[key].record : 0;
          input = wait_recv(recv_act, key, "activation", waits);
          if (!forward_only) input.requires_grad_(true);
          spans[r].end = waits.back().second;
        }
        const int s = mark();
        auto output = stage.forward(a.microbatch, input);
        const int e = mark();
        // Forward only: the output until its SEND_F, the last stage's not at all.
        if (!forward_only) {
          stash[key] = Stash{input, output};
        } else if (!stage.is_last()) {
          stash[key] = Stash{torch::Tensor(), output};
        }
        times.max_live_activations =
            std::max(times.max_live_activations, static_cast<int>(stash.size()));
        forward_spans.push_back(static_cast<int>(spans.size()));
        spans.push_back({s, e});
        break;
      }
      case Action::Op::kSendActivation: {
        auto t = need_stash("send").output.detach();
        rec.bytes_sent = bytes_of(t);
        spans.push_back({0, 0});
        sends.emplace_back(post(a, t, recs.size()), t);
        if (forward_only) stash.erase(key);  // `sends` holds it until the end of the step
        break;
      }
      case Action::Op::kBackward: {
        auto& st = need_stash("backward");
        torch::Tensor grad;
        if (!stage.is_last()) {
          const size_t r = recv_grad.count(key) ? recv_grad[key].record : 0;
          grad = wait_recv(recv_grad, key, "gradient", waits);
          spans[r].end = waits.back().second;
        }
        const int s = mark();
        stage.backward(a.microbatch, st.output, grad);
        const int e = mark();
        if (!stage.is_first()) {
          GPT2P_CHECK(st.input.grad().defined(),
                      "stage " << a.stage << " backward of micro-batch " << a.microbatch
                               << " left no gradient on its input",
                      "the stage's forward must use its input");
          input_grads[key] = st.input.grad();
        }
        stash.erase(key);
        backward_spans.push_back(static_cast<int>(spans.size()));
        spans.push_back({s, e});
        break;
      }
      case Action::Op::kWeight: {
        const int s = mark();
        stage.backward_weight(a.microbatch);
        const int e = mark();
        backward_spans.push_back(static_cast<int>(spans.size()));  // W is backward's other half
        spans.push_back({s, e});
        break;
      }
      case Action::Op::kSendGrad: {
        auto it = input_grads.find(key);
        GPT2P_CHECK(it != input_grads.end(),
                    "stage " << a.stage << " runs " << to_string(a)
                             << " before the backward of micro-batch " << a.microbatch,
                    "every B must come before its SEND_B in the action list");
        rec.bytes_sent = bytes_of(it->second);
        spans.push_back({0, 0});
        sends.emplace_back(post(a, it->second, recs.size()), it->second);
        input_grads.erase(it);
        break;
      }
    }
    recs.push_back(rec);
  }
  for (auto& s : sends) {
    const int a = mark();
    s.first->wait();
    waits.emplace_back(a, mark());
  }
  GPT2P_CHECK(stash.empty() && recv_act.empty() && recv_grad.empty() && input_grads.empty(),
              "rank " << rank_ << " ended the step with " << stash.size()
                      << " forward(s) without backward, " << recv_act.size() + recv_grad.size()
                      << " receive(s) never used and " << input_grads.size()
                      << " gradient(s) never sent",
              "the action list must be complete (build it with make_schedule)");
  // Read the clock once (on GPUs this waits for the step's events).
  for (size_t i = 0; i < recs.size(); ++i) {
    recs[i].start = step_start + clock_.elapsed(origin, spans[i].start);
    recs[i].end = step_start + clock_.elapsed(origin, spans[i].end);
  }
  for (int i : forward_spans)
    times.forward += recs[static_cast<size_t>(i)].end - recs[static_cast<size_t>(i)].start;
  for (int i : backward_spans)
    times.backward += recs[static_cast<size_t>(i)].end - recs[static_cast<size_t>(i)].start;
  for (const auto& w : waits) times.comm_wait += clock_.elapsed(w.first, w.second);
  times.actions = std::move(recs);
  return times;
}

}  // namespace gpt2p::pipeline
