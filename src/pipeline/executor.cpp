#include "gpt2p/pipeline/executor.h"

#include <algorithm>

#include "gpt2p/core/error.h"

namespace gpt2p::pipeline {
namespace {

long long bytes_of(const torch::Tensor& t) {
  return static_cast<long long>(t.numel()) * static_cast<long long>(t.element_size());
}

}  // namespace

comm::WorkPtr CommTransport::post(comm::P2POp& op, Channel channel) {
  auto& comm = channel == Channel::kActivations ? activations_ : gradients_;
  return op.kind == comm::P2POp::Kind::kSend ? comm.send_async(op.tensor, op.peer, op.tag)
                                             : comm.recv_async(op.tensor, op.peer, op.tag);
}

Executor::Executor(Stage& stage, Transport& transport, RankActions actions, int rank,
                   const torch::Device& device)
    : stage_(stage),
      transport_(transport),
      actions_(std::move(actions)),
      rank_(rank),
      clock_(device, 4 * static_cast<int>(actions_.size()) + 2) {
  for (const auto& a : actions_) {
    GPT2P_CHECK(a.stage == rank_,
                "action " << to_string(a) << " is for stage " << a.stage
                          << " but this executor runs stage " << rank_,
                "pass make_schedule(...)[rank] to the executor of that rank");
  }
}

int Executor::mark() {
  clock_.mark(next_mark_);
  return next_mark_++;
}

torch::Tensor Executor::wait_recv(std::map<int, Pending>& pending, int mb, const char* what,
                                  std::vector<std::pair<int, int>>& waits) {
  auto it = pending.find(mb);
  GPT2P_CHECK(it != pending.end(),
              "stage " << rank_ << " needs the " << what << " of micro-batch " << mb
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
  next_mark_ = 0;
  const int origin = mark();
  struct Span {
    int start, end;
  };
  std::vector<Span> spans;             // per record: marks of the action
  std::vector<io::ActionRecord> recs;  // times filled in at the end
  std::vector<std::pair<int, int>> waits;
  std::map<int, Pending> recv_act, recv_grad;
  std::map<int, Stash> stash;
  std::map<int, torch::Tensor> input_grads;
  std::vector<std::pair<comm::WorkPtr, torch::Tensor>> sends;
  std::vector<int> forward_spans, backward_spans;
  StepTimes times;

  // Posts one transfer on its direction's channel; `record` is the index of its action's record.
  auto post = [&](comm::P2POp op, bool activation, size_t record) -> comm::WorkPtr {
    const int s = mark();
    auto work = transport_.post(op, activation ? Channel::kActivations : Channel::kGradients);
    spans[record] = {s, op.kind == comm::P2POp::Kind::kRecv ? s : mark()};  // recv: end on use
    return work;
  };

  for (const auto& a : actions_) {
    io::ActionRecord rec;
    rec.step = step;
    rec.stage = a.stage;
    rec.op = static_cast<int>(a.op);
    rec.microbatch = a.microbatch;
    const int mb = a.microbatch;
    auto need_stash = [&](const char* why) -> Stash& {
      auto it = stash.find(mb);
      GPT2P_CHECK(it != stash.end(),
                  "stage " << rank_ << " runs " << to_string(a) << " (" << why
                           << ") but micro-batch " << mb << " has no forward pending",
                  "every F must come before its SEND_F, RECV_B and B in the action list");
      return it->second;
    };
    switch (a.op) {
      case Action::Op::kRecvActivation:
      case Action::Op::kRecvGrad: {
        const bool act = a.op == Action::Op::kRecvActivation;
        auto& pending = act ? recv_act : recv_grad;
        GPT2P_CHECK(pending.count(mb) == 0,
                    "stage " << rank_ << " posts " << to_string(a) << " twice",
                    "each micro-batch is received once per direction");
        torch::Tensor buffer = act ? stage_.empty_activation(mb)
                                   : torch::empty_like(need_stash("gradient buffer").output);
        rec.bytes_recv = bytes_of(buffer);
        const size_t r = recs.size();
        spans.push_back({0, 0});
        recs.push_back(rec);
        pending[mb] = Pending{buffer, post({comm::P2POp::Kind::kRecv, buffer, a.peer}, act, r), r};
        continue;
      }
      case Action::Op::kForward: {
        GPT2P_CHECK(stash.count(mb) == 0, "stage " << rank_ << " runs " << to_string(a) << " twice",
                    "each micro-batch runs forward once per step");
        torch::Tensor input;
        if (stage_.is_first()) {
          input = stage_.input(mb);
        } else {
          const size_t r = recv_act.count(mb) ? recv_act[mb].record : 0;
          input = wait_recv(recv_act, mb, "activation", waits).requires_grad_(true);
          spans[r].end = waits.back().second;
        }
        const int s = mark();
        auto output = stage_.forward(mb, input);
        const int e = mark();
        stash[mb] = Stash{input, output};
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
        sends.emplace_back(post({comm::P2POp::Kind::kSend, t, a.peer}, true, recs.size()), t);
        break;
      }
      case Action::Op::kBackward: {
        auto& st = need_stash("backward");
        torch::Tensor grad;
        if (!stage_.is_last()) {
          const size_t r = recv_grad.count(mb) ? recv_grad[mb].record : 0;
          grad = wait_recv(recv_grad, mb, "gradient", waits);
          spans[r].end = waits.back().second;
        }
        const int s = mark();
        stage_.backward(mb, st.output, grad);
        const int e = mark();
        if (!stage_.is_first()) {
          GPT2P_CHECK(st.input.grad().defined(),
                      "stage " << rank_ << " backward of micro-batch " << mb
                               << " left no gradient on its input",
                      "the stage's forward must use its input");
          input_grads[mb] = st.input.grad();
        }
        stash.erase(mb);
        backward_spans.push_back(static_cast<int>(spans.size()));
        spans.push_back({s, e});
        break;
      }
      case Action::Op::kSendGrad: {
        auto it = input_grads.find(mb);
        GPT2P_CHECK(it != input_grads.end(),
                    "stage " << rank_ << " runs " << to_string(a)
                             << " before the backward of micro-batch " << mb,
                    "every B must come before its SEND_B in the action list");
        rec.bytes_sent = bytes_of(it->second);
        spans.push_back({0, 0});
        sends.emplace_back(post({comm::P2POp::Kind::kSend, it->second, a.peer}, false, recs.size()),
                           it->second);
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
              "stage " << rank_ << " ended the step with " << stash.size()
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
