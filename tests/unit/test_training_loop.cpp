// The training loop (run_training) in one process, without MPI: the communicators are fakes
// (comm/fake_communicator.h) and the step strategy records what the loop asks of it. Pinned here:
// which steps run, where checkpoints are committed and where they resume, --save-every,
// --max-steps, a resume from the middle of an epoch, and a stop signal in a step and on an epoch's
// last batch.
#include <gtest/gtest.h>

#include <csignal>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gpt2p/cli/main_guard.h"
#include "gpt2p/comm/fake_communicator.h"
#include "gpt2p/core/atomic_file.h"
#include "gpt2p/core/stop_signal.h"
#include "gpt2p/data/dataset_file.h"
#include "gpt2p/parallel/train/loop.h"
#include "support/h5_read.h"
#include "support/synthetic_split.h"
#include "support/temp_dir.h"

namespace gpt2p::parallel {
namespace {

namespace fs = std::filesystem;

// Where a step, a checkpoint or an evaluation happened: (step, epoch, batch).
struct At {
  int64_t step, epoch, batch;
  bool operator==(const At& o) const {
    return step == o.step && epoch == o.epoch && batch == o.batch;
  }
};
std::ostream& operator<<(std::ostream& os, const At& a) {
  return os << "{step " << a.step << ", epoch " << a.epoch << ", batch " << a.batch << "}";
}

// Takes one batch per step from the data and records every call of the loop.
class RecordingStrategy final : public StepStrategy {
 public:
  explicit RecordingStrategy(TrainData& data) : data_(data) {}

  void set_training(bool training) override { modes.push_back(training); }

  double step(io::StepRecord& rec, bool more) override {
    const auto at = data_.position();
    steps.push_back({rec.step, at.epoch, at.batch});
    mores.push_back(more);
    data_.next();
    rec.loss = 10.0 - 0.01 * static_cast<double>(rec.step);
    rec.padded_tokens = 64;
    rec.target_tokens = 32;
    if (on_step) on_step(rec.step);
    return 0;
  }

  void cancel_next() override { ++cancels; }

  void save(const std::string& dir, const model::TrainState& state) override {
    saves.push_back({state.step, state.epoch, state.batch_in_epoch});
    save_dirs.push_back(dir);
  }

  EpochEval evaluate(int64_t epoch, const StopCheck& stop) override {
    evaluations.push_back(epoch);
    EpochEval e;
    e.loss = 5.0;
    e.perplexity = 148.4;
    e.stopped = stop();
    return e;
  }

  std::function<void(int64_t step)> on_step;  // runs inside each step, after its batch
  std::vector<At> steps, saves;
  std::vector<bool> mores, modes;
  std::vector<std::string> save_dirs;
  std::vector<int64_t> evaluations;
  int cancels = 0;

 private:
  TrainData& data_;
};

class TrainingLoop : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::make_unique<gpt2p::testing::TempDir>("gpt2p_loop");
    data::DatasetMeta meta;
    meta.tokenizer_identity = "synthetic";
    meta.vocab_size = 50260;
    meta.special = {50257, 50258, 50259};
    meta.source = "test_training_loop";
    const auto split = gpt2p::testing::synthetic_split(16, 7);
    data::write_dataset_file(path("data.h5"), meta,
                             {{"train", split}, {"validation", split}, {"test", split}});
    cfg.output.out = path("run");
    cfg.optim.epochs = 2;
    cfg.optim.max_steps = 0;
    cfg.output.save_every = 0;
    cfg.output.log_every = 1;
    cfg.optim.seed = 3;
    cfg.optim.batch_size = 4;
    cfg.optim.seq_len = 16;
  }

  std::string path(const std::string& name) const { return (*dir_) / name; }

  // 16 pairs in batches of 4: 4 steps an epoch.
  TrainData open_data() const {
    TrainDataOptions o;
    o.path = path("data.h5");
    o.tokenizer_identity = "synthetic";
    o.vocab_size = 50260;
    o.global_batch = cfg.optim.batch_size;
    o.seq_len = cfg.optim.seq_len;
    o.seed = cfg.optim.seed;
    return TrainData(o, 0, 1);
  }

  // Trains from `state` with `strategy`'s data; returns run_training's exit code.
  int train(TrainData& data, RecordingStrategy& strategy, const model::TrainState& state = {},
            io::RecordMode mode = io::RecordMode::kCreate) {
    fs::create_directories(cfg.output.out);
    io::RunIdentity id;
    id.program = "test_loop";
    id.config_json = "{}";
    io::RunRecorder recorder(cfg.output.out, id, mode);
    LoopSetup setup;
    setup.program = "test_loop";
    return run_training(LoopContext{cfg, torch::kCPU, comm, control}, data, recorder, state, setup,
                        strategy);
  }

  std::vector<double> recorded_steps() const {
    return gpt2p::testing::read_column(cfg.output.out + "/rank0.h5", "/steps/step");
  }

  TrainConfig cfg;
  comm::FakeCommunicator comm{0, 1}, control{0, 1};
  std::unique_ptr<gpt2p::testing::TempDir> dir_;
};

TEST_F(TrainingLoop, EveryEpochTrainsEvaluatesAndCommitsAtItsEnd) {
  auto data = open_data();
  ASSERT_EQ(data.batches_per_epoch(), 4);
  RecordingStrategy s(data);
  ASSERT_EQ(train(data, s), 0);
  ASSERT_EQ(s.steps.size(), 8U);
  for (int64_t i = 0; i < 8; ++i) EXPECT_EQ(s.steps[i], (At{i, i / 4, i % 4})) << i;
  // `more` is false on each epoch's last batch: no batch of the next epoch is taken early.
  EXPECT_EQ(s.mores, (std::vector<bool>{true, true, true, false, true, true, true, false}));
  EXPECT_EQ(s.evaluations, (std::vector<int64_t>{0, 1}));
  // --save-every 0: one checkpoint per epoch, resuming at the next epoch's first batch.
  EXPECT_EQ(s.saves, (std::vector<At>{{4, 1, 0}, {8, 2, 0}}));
  EXPECT_EQ(s.save_dirs.front(), cfg.output.out + "/checkpoint");
  EXPECT_EQ(s.modes, (std::vector<bool>{true, false, true, false}));
  EXPECT_EQ(s.cancels, 0);
  EXPECT_EQ(recorded_steps(), (std::vector<double>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(gpt2p::testing::read_column(cfg.output.out + "/rank0.h5", "/epochs/epoch"),
            (std::vector<double>{0, 1}));
}

TEST_F(TrainingLoop, SaveEveryAndMaxStepsCommitWhereTheNextStepStarts) {
  cfg.output.save_every = 2;
  cfg.optim.max_steps = 5;
  auto data = open_data();
  RecordingStrategy s(data);
  ASSERT_EQ(train(data, s), 0);
  ASSERT_EQ(s.steps.size(), 5U);
  EXPECT_EQ(s.steps.back(), (At{4, 1, 0}));
  EXPECT_FALSE(s.mores.back()) << "the last step of --max-steps takes no batch early";
  // Every 2 steps (step 4 resumes at epoch 1's first batch), then the run's last step.
  EXPECT_EQ(s.saves, (std::vector<At>{{2, 0, 2}, {4, 1, 0}, {5, 1, 1}}));
  // Epoch 0 ended and was evaluated; --max-steps ended epoch 1 after one batch, which is
  // evaluated too (the run's last epoch row).
  EXPECT_EQ(s.evaluations, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(s.cancels, 1) << "--max-steps cancels a batch taken early";
}

TEST_F(TrainingLoop, AResumeContinuesAtItsStepAndBatch) {
  cfg.output.save_every = 2;
  auto data = open_data();
  model::TrainState state;
  state.step = 2;
  state.epoch = 0;
  state.batch_in_epoch = 2;
  data.set_position({state.epoch, state.batch_in_epoch});
  RecordingStrategy s(data);
  ASSERT_EQ(train(data, s, state), 0);
  ASSERT_EQ(s.steps.size(), 6U);
  EXPECT_EQ(s.steps.front(), (At{2, 0, 2}));
  EXPECT_EQ(s.steps.back(), (At{7, 1, 3}));
  EXPECT_EQ(s.saves, (std::vector<At>{{4, 1, 0}, {6, 1, 2}, {8, 2, 0}}));
  EXPECT_EQ(recorded_steps(), (std::vector<double>{2, 3, 4, 5, 6, 7}));
}

TEST_F(TrainingLoop, AResumeOfAFinishedRunTrainsNothing) {
  cfg.optim.max_steps = 3;
  auto data = open_data();
  model::TrainState state;
  state.step = 3;
  state.batch_in_epoch = 3;
  data.set_position({0, 3});
  RecordingStrategy s(data);
  ASSERT_EQ(train(data, s, state), 0);
  EXPECT_TRUE(s.steps.empty());
  EXPECT_TRUE(s.saves.empty());
  EXPECT_TRUE(s.evaluations.empty());
}

TEST_F(TrainingLoop, AStopSignalInAStepCommitsAfterItAndEndsTheRun) {
  StopSignals signals;
  auto data = open_data();
  RecordingStrategy s(data);
  s.on_step = [](int64_t step) {
    if (step == 1) std::raise(SIGUSR1);
  };
  ASSERT_EQ(train(data, s), cli::kExitStopped);
  EXPECT_EQ(s.steps.size(), 2U) << "the step in progress finishes; no other starts";
  EXPECT_EQ(s.saves, (std::vector<At>{{2, 0, 2}}));
  EXPECT_EQ(s.cancels, 1) << "the batch taken early goes back";
  EXPECT_EQ(data.position().batch, 2) << "the data stands where the next step starts";
  EXPECT_TRUE(s.evaluations.empty()) << "a stop inside an epoch does not evaluate it";
  EXPECT_TRUE(fs::exists(cfg.output.out + "/stopped.json"));
  EXPECT_EQ(recorded_steps(), (std::vector<double>{0, 1}));
}

TEST_F(TrainingLoop, AStopOnAnEpochsLastBatchRecordsTheEpochAndResumesAfterIt) {
  StopSignals signals;
  auto data = open_data();
  RecordingStrategy s(data);
  s.on_step = [](int64_t step) {
    if (step == 3) std::raise(SIGTERM);
  };
  ASSERT_EQ(train(data, s), cli::kExitStopped);
  EXPECT_EQ(s.steps.size(), 4U);
  // The epoch's row is written; its evaluation sees the agreed stop at once.
  EXPECT_EQ(s.evaluations, (std::vector<int64_t>{0}));
  EXPECT_EQ(s.saves, (std::vector<At>{{4, 1, 0}})) << "one checkpoint, at the next epoch";
  EXPECT_EQ(gpt2p::testing::read_column(cfg.output.out + "/rank0.h5", "/epochs/epoch"),
            (std::vector<double>{0}));
}

TEST(FakeCommunicator, MirrorsThisRanksTensorsAndCountsEveryCall) {
  comm::FakeCommunicator c(1, 4);
  auto t = torch::tensor({1.0f, 2.0f});
  c.all_reduce(t, comm::ReduceOp::kSum);
  EXPECT_TRUE(t.equal(torch::tensor({4.0f, 8.0f})));
  c.all_reduce(t, comm::ReduceOp::kAvg);
  EXPECT_TRUE(t.equal(torch::tensor({4.0f, 8.0f})));
  const auto all = c.all_gather(torch::tensor({7}));
  EXPECT_TRUE(all.equal(torch::tensor({{7}, {7}, {7}, {7}})));
  auto out = torch::zeros({2});
  c.reduce_scatter(torch::arange(8, torch::kFloat32), out, comm::ReduceOp::kSum);
  EXPECT_TRUE(out.equal(torch::tensor({8.0f, 12.0f}))) << "rank 1's part, times 4 ranks";
  c.send(t, 0);
  EXPECT_THROW(c.send(t, 1), Error) << "a rank cannot send to itself";
  EXPECT_THROW(c.send(t, 4), Error);
  c.barrier();
  EXPECT_EQ(c.calls("all_reduce"), 2);
  EXPECT_EQ(c.calls("all_gather"), 1);
  EXPECT_EQ(c.calls("reduce_scatter"), 1);
  EXPECT_EQ(c.calls("send"), 3);
  EXPECT_EQ(c.calls("barrier"), 1);
  EXPECT_THROW(comm::FakeCommunicator(2, 2), Error);
}

}  // namespace
}  // namespace gpt2p::parallel
