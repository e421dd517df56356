// The executor with a recording fake stage and an in-process fake transport (no MPI): what runs is
// exactly what the schedule says, values flow where they should, and broken lists fail clearly.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "gpt2p/core/error.h"
#include "gpt2p/pipeline/plan/zero_bubble.h"
#include "gpt2p/pipeline/runtime/executor.h"

namespace gpt2p::pipeline {
namespace {

// Stage s multiplies its input by a weight w = s + 2 (the last stage sums to a loss). Every call
// is appended to a shared log.
class FakeStage : public Stage {
 public:
  FakeStage(int s, int n, std::vector<std::string>* log)
      : s_(s),
        n_(n),
        log_(log),
        w_(torch::full({2}, static_cast<double>(s + 2)).requires_grad_(true)) {}
  bool is_first() const override { return s_ == 0; }
  bool is_last() const override { return s_ == n_ - 1; }
  torch::Tensor input(int mb) override { return torch::full({2}, static_cast<double>(mb + 1)); }
  torch::Tensor empty_activation(int) override { return torch::empty({2}); }
  torch::Tensor forward(int mb, const torch::Tensor& x) override {
    log_->push_back(std::to_string(s_) + "F" + std::to_string(mb));
    grad_mode = torch::GradMode::is_enabled();
    input_requires_grad = x.requires_grad();
    auto y = x * w_;
    return is_last() ? y.sum() : y;
  }
  void backward(int mb, const torch::Tensor& out, const torch::Tensor& grad) override {
    log_->push_back(std::to_string(s_) + "B" + std::to_string(mb));
    if (grad.defined()) {
      torch::autograd::backward({out}, {grad});
    } else {
      out.backward();
    }
  }
  void backward_weight(int mb) override {
    log_->push_back(std::to_string(s_) + "W" + std::to_string(mb));
  }
  torch::Tensor w() const { return w_; }
  bool grad_mode = false, input_requires_grad = false;  // in the last forward

 private:
  int s_, n_;
  std::vector<std::string>* log_;
  torch::Tensor w_;
};

class DoneWork : public comm::Work {
 public:
  void wait() override {}
  bool is_completed() override { return true; }
};

// Receives are filled with 1s; sends are kept; the channel of every transfer is recorded.
class FakeTransport : public Transport {
 public:
  explicit FakeTransport(int s, std::vector<std::string>* log) : s_(s), log_(log) {}
  comm::WorkPtr post(comm::P2POp& op, Channel channel) override {
    if (op.kind == comm::P2POp::Kind::kSend) {
      log_->push_back(std::to_string(s_) + "SEND->" + std::to_string(op.peer));
      sent.push_back(op.tensor.clone());
    } else {
      log_->push_back(std::to_string(s_) + "RECV<-" + std::to_string(op.peer));
      op.tensor.fill_(1.0);
    }
    channels.push_back(channel);
    return std::make_unique<DoneWork>();
  }
  std::vector<torch::Tensor> sent;
  std::vector<Channel> channels;

 private:
  int s_;
  std::vector<std::string>* log_;
};

// What the fake log should read for an action list on n_ranks ranks (transfers name peer ranks).
// Rank r's V fake stages of n (r, r + R, ...: interleaved), logging into `log`; `owned` keeps
// them alive.
std::vector<Stage*> rank_stages(int r, int R, int V, int n, std::vector<std::string>* log,
                                std::vector<std::unique_ptr<FakeStage>>& owned) {
  std::vector<Stage*> stages;
  for (int c = 0; c < V; ++c) {
    owned.push_back(std::make_unique<FakeStage>(r + c * R, n, log));
    stages.push_back(owned.back().get());
  }
  return stages;
}

std::vector<std::string> expected_log(const RankActions& actions, int n_ranks) {
  std::vector<std::string> out;
  for (const auto& a : actions) {
    const auto s = std::to_string(a.stage);
    if (a.is_compute()) {
      const char* op = a.op == Action::Op::kForward    ? "F"
                       : a.op == Action::Op::kBackward ? "B"
                                                       : "W";
      out.push_back(s + op + std::to_string(a.microbatch));
    } else {
      out.push_back(std::to_string(rank_of_stage(a.stage, n_ranks)) +
                    (a.is_send() ? "SEND->" : "RECV<-") +
                    std::to_string(rank_of_stage(a.peer, n_ranks)));
    }
  }
  return out;
}

// Runs `actions` as stage s of n on a fake stage and transport, expects the calls in list order,
// and returns the step's records.
StepTimes expect_runs_as_listed(const RankActions& actions, int s, int n, long long step,
                                double start, Pass pass = Pass::kTraining) {
  std::vector<std::string> log;
  FakeStage stage(s, n, &log);
  FakeTransport transport(s, &log);
  Executor exec(stage, transport, actions, s, n, torch::kCPU, pass);
  auto times = exec.run_step(step, start);
  EXPECT_EQ(log, expected_log(actions, n));
  return times;
}

TEST(Executor, RunsExactlyTheScheduleOnEveryRank) {
  for (auto kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB}) {
    for (int n : {1, 2, 3, 4}) {
      for (int m : {1, 2, 4}) {
        const auto schedule = make_schedule(kind, m, n);
        for (int s = 0; s < n; ++s) {
          SCOPED_TRACE(to_string(kind) + " n=" + std::to_string(n) + " m=" + std::to_string(m) +
                       " stage " + std::to_string(s));
          const auto times = expect_runs_as_listed(schedule[static_cast<size_t>(s)], s, n, 7, 1.5);
          // One record per action, in order, with its op code, micro-batch and sane times.
          ASSERT_EQ(times.actions.size(), schedule[static_cast<size_t>(s)].size());
          for (size_t i = 0; i < times.actions.size(); ++i) {
            const auto& a = schedule[static_cast<size_t>(s)][i];
            EXPECT_EQ(times.actions[i].op, static_cast<int>(a.op));
            EXPECT_EQ(times.actions[i].microbatch, a.microbatch);
            EXPECT_EQ(times.actions[i].step, 7);
            EXPECT_GE(times.actions[i].start, 1.5);
            EXPECT_GE(times.actions[i].end, times.actions[i].start);
            EXPECT_EQ(times.actions[i].bytes_sent > 0, a.is_send());
            EXPECT_EQ(times.actions[i].bytes_recv > 0, a.is_recv());
          }
          const int live = kind == ScheduleKind::kGPipe ? m : std::min(m, n - s);
          EXPECT_EQ(times.max_live_activations, live);
        }
      }
    }
  }
}

TEST(Executor, RunsTheWActionsOfZeroBubbleSchedulesWhereTheyStand) {
  for (int n : {2, 3}) {
    for (int m : {2, 4}) {
      ZeroBubbleCosts costs{std::vector<double>(static_cast<size_t>(n), 1.0),
                            std::vector<double>(static_cast<size_t>(n), 1.0),
                            std::vector<double>(static_cast<size_t>(n), 1.0), 0.0};
      const auto schedule = make_zero_bubble_schedule(ScheduleKind::kOneFOneB, m, n, 1, costs);
      for (int s = 0; s < n; ++s) {
        SCOPED_TRACE("n=" + std::to_string(n) + " m=" + std::to_string(m) + " stage " +
                     std::to_string(s));
        const auto times = expect_runs_as_listed(schedule[static_cast<size_t>(s)], s, n, 0, 0.0);
        int weights = 0;
        for (const auto& r : times.actions) weights += r.op == 7 ? 1 : 0;
        EXPECT_EQ(weights, m) << "one W (op 7 in timing files) per micro-batch";
      }
    }
  }
}

TEST(Executor, PostsActivationsAndGradientsOnTheirOwnChannels) {
  for (auto kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB}) {
    for (int n : {2, 3, 4}) {
      const auto schedule = make_schedule(kind, 4, n);
      for (int s = 0; s < n; ++s) {
        std::vector<std::string> log;
        FakeStage stage(s, n, &log);
        FakeTransport transport(s, &log);
        const auto& actions = schedule[static_cast<size_t>(s)];
        Executor(stage, transport, actions, s, n, torch::kCPU).run_step(0, 0);
        std::vector<Channel> want;
        for (const auto& a : actions) {
          if (a.is_compute()) continue;
          const bool act =
              a.op == Action::Op::kSendActivation || a.op == Action::Op::kRecvActivation;
          want.push_back(act ? Channel::kActivations : Channel::kGradients);
        }
        EXPECT_EQ(transport.channels, want) << to_string(kind) << " n=" << n << " stage " << s;
      }
    }
  }
}

TEST(Executor, SendsActivationsAndInputGradientsAndAccumulates) {
  // Middle stage of 3 (w = 3), 1F1B with 2 micro-batches: received activations and gradients are
  // 1s, so every activation sent is 3, every input gradient sent is 3, and w's gradient sums
  // grad * input over both micro-batches: 2.
  std::vector<std::string> log;
  FakeStage stage(1, 3, &log);
  FakeTransport transport(1, &log);
  Executor exec(stage, transport, make_schedule(ScheduleKind::kOneFOneB, 2, 3)[1], 1, 3,
                torch::kCPU);
  exec.run_step(0, 0.0);
  ASSERT_EQ(transport.sent.size(), 4u);
  for (const auto& t : transport.sent) EXPECT_TRUE(torch::equal(t, torch::full({2}, 3.0)));
  EXPECT_TRUE(torch::equal(stage.w().grad(), torch::full({2}, 2.0)));

  // First stage of 2: inputs mb+1 = 1, 2; the gradient received is 1, so w.grad = 1 + 2.
  std::vector<std::string> log0;
  FakeStage first(0, 2, &log0);
  FakeTransport t0(0, &log0);
  Executor e0(first, t0, make_schedule(ScheduleKind::kGPipe, 2, 2)[0], 0, 2, torch::kCPU);
  e0.run_step(0, 0.0);
  EXPECT_TRUE(torch::equal(first.w().grad(), torch::full({2}, 3.0)));
  EXPECT_TRUE(torch::equal(t0.sent[1], torch::full({2}, 4.0)));  // activation of mb 1: 2 * 2
}

// Interleaved: each rank holds V stages (rank + c R) and runs exactly its list over them, posting
// every transfer to the peer stage's rank on the channel the schedule gives it.
TEST(Executor, RunsInterleavedStagesOfOneRank) {
  for (int R : {2, 3}) {
    for (int V : {2, 3}) {
      const int n = R * V;
      const auto schedule = make_schedule(ScheduleKind::kInterleaved, 2 * R, R, V);
      for (int r = 0; r < R; ++r) {
        SCOPED_TRACE("R=" + std::to_string(R) + " V=" + std::to_string(V) + " rank " +
                     std::to_string(r));
        std::vector<std::string> log;
        std::vector<std::unique_ptr<FakeStage>> owned;
        const auto stages = rank_stages(r, R, V, n, &log, owned);
        FakeTransport transport(r, &log);
        const auto& actions = schedule[static_cast<size_t>(r)];
        const auto times = Executor(stages, transport, actions, r, R, torch::kCPU).run_step(0, 0);
        EXPECT_EQ(log, expected_log(actions, R));
        ASSERT_EQ(times.actions.size(), actions.size());
        std::vector<Channel> want;
        for (size_t i = 0; i < actions.size(); ++i) {
          EXPECT_EQ(times.actions[i].stage, actions[i].stage);
          if (!actions[i].is_compute()) want.push_back(channel_of(actions[i], R));
        }
        EXPECT_EQ(transport.channels, want);
        // Every stage's weight got the gradients of both micro-batches.
        for (const auto& st : owned) EXPECT_TRUE(st->w().grad().defined());
      }
    }
  }
}

// Forward only (evaluation): exactly the list, under no-grad, with nothing kept for a backward
// (at most the output waiting for its SEND_F) and no gradient on the stage's weight.
TEST(Executor, RunsForwardOnlyListsWithoutGradients) {
  for (int n : {1, 2, 3}) {
    for (int m : {1, 2, 3}) {
      const auto schedule = make_forward_only_schedule(m, n);
      for (int s = 0; s < n; ++s) {
        SCOPED_TRACE("n=" + std::to_string(n) + " m=" + std::to_string(m) + " stage " +
                     std::to_string(s));
        const auto& actions = schedule[static_cast<size_t>(s)];
        const auto times = expect_runs_as_listed(actions, s, n, 3, 0.5, Pass::kForwardOnly);
        ASSERT_EQ(times.actions.size(), actions.size());
        EXPECT_EQ(times.max_live_activations, s + 1 < n ? 1 : 0);
        EXPECT_EQ(times.backward, 0.0);
      }
    }
  }
  // Middle stage of 3 (w = 3), received activations 1: sends 3 per micro-batch, computes without
  // autograd and leaves w without a gradient. GradMode is back on after the step.
  std::vector<std::string> log;
  FakeStage stage(1, 3, &log);
  FakeTransport transport(1, &log);
  Executor exec(stage, transport, make_forward_only_schedule(2, 3)[1], 1, 3, torch::kCPU,
                Pass::kForwardOnly);
  exec.run_step(0, 0.0);
  ASSERT_EQ(transport.sent.size(), 2u);
  for (const auto& t : transport.sent) {
    EXPECT_TRUE(torch::equal(t, torch::full({2}, 3.0)));
    EXPECT_FALSE(t.requires_grad());
  }
  EXPECT_FALSE(stage.grad_mode);
  EXPECT_FALSE(stage.input_requires_grad);
  EXPECT_FALSE(stage.w().grad().defined());
  EXPECT_TRUE(torch::GradMode::is_enabled());
  // Run again: nothing of the first run is left behind.
  exec.run_step(1, 0.0);
  EXPECT_EQ(transport.sent.size(), 4u);
}

TEST(Executor, RunsForwardOnlyInterleavedStagesOnTheirChannels) {
  for (int R : {2, 3}) {
    for (int V : {2, 3}) {
      for (int m : {1, 2}) {
        const int n = R * V;
        const auto schedule = make_forward_only_schedule(m, R, V);
        for (int r = 0; r < R; ++r) {
          SCOPED_TRACE("R=" + std::to_string(R) + " V=" + std::to_string(V) +
                       " m=" + std::to_string(m) + " rank " + std::to_string(r));
          std::vector<std::string> log;
          std::vector<std::unique_ptr<FakeStage>> owned;
          const auto stages = rank_stages(r, R, V, n, &log, owned);
          FakeTransport transport(r, &log);
          const auto& actions = schedule[static_cast<size_t>(r)];
          Executor(stages, transport, actions, r, R, torch::kCPU, Pass::kForwardOnly)
              .run_step(0, 0);
          EXPECT_EQ(log, expected_log(actions, R));
          std::vector<Channel> want;
          for (const auto& a : actions) {
            if (!a.is_compute()) want.push_back(channel_of(a, R));
          }
          EXPECT_EQ(transport.channels, want);
          for (const auto c : transport.channels) {
            EXPECT_TRUE(c == Channel::kActivations || c == Channel::kActivationsWrap);
          }
          for (const auto& st : owned) EXPECT_FALSE(st->w().grad().defined());
        }
      }
    }
  }
}

std::string run_error(const std::string& actions, int rank, int n, Pass pass = Pass::kTraining) {
  std::vector<std::string> log;
  FakeStage stage(rank, n, &log);
  FakeTransport transport(rank, &log);
  try {
    Executor exec(stage, transport, parse_actions(actions), rank, n, torch::kCPU, pass);
    exec.run_step(0, 0.0);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(Executor, BrokenActionListsFailClearly) {
  EXPECT_NE(
      run_error("1F0", 0, 2)
          .find(
              "action 1F0 is for stage 1 but the executor of rank 0 runs 1 stage(s) from stage 0"),
      std::string::npos);
  EXPECT_NE(run_error("2F0", 0, 2).find("action 2F0 is for stage 2"), std::string::npos);
  EXPECT_NE(run_error("0B0", 0, 2).find("micro-batch 0 has no forward pending"), std::string::npos);
  EXPECT_NE(run_error("1F0 1B0", 1, 2).find("no receive for it was posted"), std::string::npos);
  EXPECT_NE(run_error("0F0 0SEND_F0->1", 0, 2).find("1 forward(s) without backward"),
            std::string::npos);
  EXPECT_NE(run_error("1RECV_F0<-0 1F0 1B0", 1, 2).find("1 gradient(s) never sent"),
            std::string::npos);
  EXPECT_NE(run_error("0F0 0F0", 0, 2).find("runs 0F0 twice"), std::string::npos);
  // Forward only: no backward work, and every activation sent.
  EXPECT_NE(run_error("1RECV_F0<-0 1F0 1B0", 1, 2, Pass::kForwardOnly)
                .find("action 1B0 is backward work but the executor of rank 1 runs forward only"),
            std::string::npos);
  EXPECT_NE(run_error("0F0", 0, 2, Pass::kForwardOnly).find("1 forward(s) without backward"),
            std::string::npos);
  EXPECT_EQ(run_error("0F0 0SEND_F0->1", 0, 2, Pass::kForwardOnly), "no error");
}

}  // namespace
}  // namespace gpt2p::pipeline
