// The data-parallel trainer end to end at 2, 3 and 4 ranks: train_data_parallel on a small dataset
// file (tokenized with the real GPT-2 tokenizer) writes rank<r>.h5 with the HW5 metrics, saves a
// checkpoint, and a --resume from it continues at the right step exactly as an uninterrupted run.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "gpt2p/cli/main_guard.h"
#include "gpt2p/model/checkpoint.h"
#include "gpt2p/parallel/trainers/dp_trainer.h"
#include "support/h5_read.h"
#include "support/trainer_fixture.h"

namespace gpt2p::parallel {
namespace {

namespace fs = std::filesystem;
using gpt2p::testing::read_column;

class DataParallelTrainer : public gpt2p::testing::TrainerTest {
 protected:
  parallel::TrainConfig config(const std::string& out, int64_t max_steps) const {
    auto c = TrainerTest::config(out, max_steps);
    c.data_parallel.grad_sync = gpt2p::parallel::GradSyncMode::kBucketed;
    c.data_parallel.bucket_mb = 0.05;
    return c;
  }
};

TEST_F(DataParallelTrainer, WritesRankFilesAndResumesAtTheRightStep) {
  ASSERT_EQ(train_data_parallel(config("a", 2), parallel::Program::kDataParallel, topo), 0);
  const auto a = rank_file("a");
  ASSERT_TRUE(fs::exists(a)) << a;
  EXPECT_EQ(read_column(a, "/steps/step"), (std::vector<double>{0, 1}));
  const double local_rows = 12.0 / comm->size();
  for (const char* col : {"forward", "backward", "sync_total", "target_tokens", "loss"}) {
    for (double v : read_column(a, std::string("/steps/") + col)) EXPECT_GT(v, 0) << col;
  }
  for (double v : read_column(a, "/steps/padded_tokens")) EXPECT_EQ(v, local_rows * 16);
  const auto start = read_column(a, "/steps/start");
  const auto end = read_column(a, "/steps/end");
  for (size_t i = 0; i < start.size(); ++i) EXPECT_GT(end[i], start[i]);
  for (const char* col : {"train_time", "tokens_per_sec", "target_tokens_per_sec", "val_loss"}) {
    const auto v = read_column(a, std::string("/epochs/") + col);
    ASSERT_EQ(v.size(), 1U) << col;
    EXPECT_GT(v[0], 0) << col;
  }
  EXPECT_GT(read_column(a, "/epochs/val_ppl")[0], 1);
  const auto state = model::read_train_state(dir + "/a/checkpoint");
  EXPECT_EQ(state.step, 2);
  EXPECT_EQ(state.epoch, 0);
  EXPECT_EQ(state.batch_in_epoch, 2);

  // Resuming from step 2 runs step 2 exactly as a run that never stopped.
  auto resumed = config("b", 3);
  resumed.output.resume = dir + "/a/checkpoint";
  ASSERT_EQ(train_data_parallel(resumed, parallel::Program::kDataParallel, topo), 0);
  ASSERT_EQ(train_data_parallel(config("c", 3), parallel::Program::kDataParallel, topo), 0);
  EXPECT_EQ(read_column(rank_file("b"), "/steps/step"), (std::vector<double>{2}));
  EXPECT_EQ(read_column(rank_file("b"), "/steps/epoch"), (std::vector<double>{0}));
  expect_resume_continues_the_run(1e-6);
}

TEST_F(DataParallelTrainer, LossPositionsTargetsAndAllTrainTheSame) {
  auto all = config("all", 3);
  all.compute.loss_positions = gpt2p::model::LossPositions::kAll;
  ASSERT_EQ(train_data_parallel(config("targets", 3), parallel::Program::kDataParallel, topo), 0);
  ASSERT_EQ(train_data_parallel(all, parallel::Program::kDataParallel, topo), 0);
  expect_same_losses("targets", "all", 3);
}

TEST_F(DataParallelTrainer, SparseAndDenseEmbeddingSyncTrainTheSame) {
  auto dense = config("dense", 3);
  dense.data_parallel.embedding_sync = gpt2p::parallel::EmbeddingSync::kDense;
  auto sparse = config("sparse", 3);
  sparse.data_parallel.embedding_sync = gpt2p::parallel::EmbeddingSync::kSparse;
  ASSERT_EQ(train_data_parallel(sparse, parallel::Program::kDataParallel, topo), 0);
  ASSERT_EQ(train_data_parallel(dense, parallel::Program::kDataParallel, topo), 0);
  expect_same_losses("sparse", "dense", 3);
}

}  // namespace
}  // namespace gpt2p::parallel

namespace gpt2p::parallel {
namespace {

// With dropout every rank draws its own masks: a resumed run continues each rank's generator
// (the checkpoint keeps one state per rank), so every rank's losses equal the unbroken run's
// exactly.
TEST_F(DataParallelTrainer, ResumeWithDropoutIsBitwiseOnEveryRank) {
  const auto with_dropout = [&](const std::string& out, int64_t steps) {
    auto c = config(out, steps);
    c.model.dropout = 0.1;
    return c;
  };
  ASSERT_EQ(train_data_parallel(with_dropout("a", 2), parallel::Program::kDataParallel, topo), 0);
  auto resumed = with_dropout("b", 3);
  resumed.output.resume = dir + "/a/checkpoint";
  ASSERT_EQ(train_data_parallel(resumed, parallel::Program::kDataParallel, topo), 0);
  ASSERT_EQ(train_data_parallel(with_dropout("c", 3), parallel::Program::kDataParallel, topo), 0);
  EXPECT_EQ(model::read_train_state(dir + "/a/checkpoint").rank_rng_states.size(),
            static_cast<size_t>(comm->size()));
  expect_resume_continues_the_run(0.0);
}

// A checkpoint taken on an epoch's last step resumes at the next epoch's first batch.
TEST_F(DataParallelTrainer, ACheckpointOnAnEpochsLastStepResumes) {
  auto one = config("p", 0);
  one.output.save_every = -1;
  ASSERT_EQ(train_data_parallel(one, parallel::Program::kDataParallel, topo), 0);
  const auto per_epoch = static_cast<int64_t>(read_column(rank_file("p"), "/steps/step").size());
  auto a = config("a", per_epoch);
  a.optim.epochs = 2;
  a.output.save_every = per_epoch;
  ASSERT_EQ(train_data_parallel(a, parallel::Program::kDataParallel, topo), 0);
  const auto state = model::read_train_state(dir + "/a/checkpoint");
  EXPECT_EQ(state.epoch, 1);
  EXPECT_EQ(state.batch_in_epoch, 0);
  auto b = config("b", per_epoch + 1);
  b.optim.epochs = 2;
  b.output.resume = dir + "/a/checkpoint";
  ASSERT_EQ(train_data_parallel(b, parallel::Program::kDataParallel, topo), 0);
  EXPECT_EQ(read_column(rank_file("b"), "/steps/epoch"), (std::vector<double>{1}));
}

// --save-every 2 over 3 steps commits steps 2 and 3: a finished run loses none of its steps. A
// resume of it with the same --max-steps has nothing left to train.
TEST_F(DataParallelTrainer, AFinishedRunCommitsItsLastStepAndItsResumeTrainsNothing) {
  auto a = config("a", 3);
  a.output.save_every = 2;
  ASSERT_EQ(train_data_parallel(a, parallel::Program::kDataParallel, topo), 0);
  const auto state = model::read_train_state(dir + "/a/checkpoint");
  EXPECT_EQ(state.step, 3);
  EXPECT_EQ(state.epoch, 0);
  EXPECT_EQ(state.batch_in_epoch, 3);
  auto b = config("b", 3);
  b.output.resume = dir + "/a/checkpoint";
  ASSERT_EQ(train_data_parallel(b, parallel::Program::kDataParallel, topo), 0);
  EXPECT_TRUE(read_column(rank_file("b"), "/steps/step").empty());
  EXPECT_EQ(model::read_train_state(dir + "/a/checkpoint").step, 3);
}

// A fresh run into an --out that holds a checkpoint is refused on every rank, the checkpoint
// untouched; --overwrite lets it start over.
TEST_F(DataParallelTrainer, AFreshRunDoesNotReplaceACheckpointWithoutOverwrite) {
  ASSERT_EQ(train_data_parallel(config("a", 2), parallel::Program::kDataParallel, topo), 0);
  const auto before = fs::last_write_time(dir + "/a/checkpoint/model.safetensors");
  try {
    train_data_parallel(config("a", 1), parallel::Program::kDataParallel, topo);
    ADD_FAILURE() << "a fresh run over a checkpoint must be refused";
  } catch (const cli::AgreedFailure& e) {
    EXPECT_EQ(e.code, cli::kExitUsage);
    if (e.reporter) {
      EXPECT_NE(std::string(e.what()).find("--overwrite"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(fs::last_write_time(dir + "/a/checkpoint/model.safetensors"), before);
  auto again = config("a", 1);
  again.output.overwrite = true;
  EXPECT_EQ(train_data_parallel(again, parallel::Program::kDataParallel, topo), 0);
}

}  // namespace
}  // namespace gpt2p::parallel
