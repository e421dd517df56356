// pp_train's loop end to end at 2, 3 and 4 ranks (one stage each, and two each interleaved): rank
// files with the steps and the executed actions, a checkpoint per stage, and a --resume that
// continues exactly as a run that never stopped, on the split the checkpoint was written with even
// when --partition says another.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>

#include "gpt2p/core/error.h"
#include "gpt2p/model/checkpoint.h"
#include "gpt2p/parallel/trainers/dp_trainer.h"
#include "gpt2p/parallel/trainers/pp_trainer.h"
#include "support/h5_read.h"
#include "support/trainer_fixture.h"

namespace gpt2p::parallel {
namespace {

namespace fs = std::filesystem;
using gpt2p::testing::read_attribute;
using gpt2p::testing::read_column;

class PipelineTrainer : public gpt2p::testing::TrainerTest {
 protected:
  // 4 blocks (4 stages fit), 1F1B over 2 micro-batches.
  parallel::TrainConfig config(const std::string& out, int64_t max_steps,
                               const std::string& partition) const {
    auto c = TrainerTest::config(out, max_steps, /*blocks=*/4);
    c.pipeline.mode = gpt2p::parallel::PipelineMode::kPipeline;
    c.pipeline.schedule = gpt2p::pipeline::ScheduleKind::kOneFOneB;
    c.pipeline.microbatches = 2;
    c.pipeline.partition = *from_name<pipeline::PartitionKind>(partition);
    return c;
  }
};

TEST_F(PipelineTrainer, MeasuredSplitTrainsCheckpointsAndResumesOnItsSplit) {
  ASSERT_EQ(train_pipeline(config("a", 2, "measured"), topo), 0);
  const auto a = rank_file("a");
  ASSERT_TRUE(fs::exists(a)) << a;
  EXPECT_EQ(read_column(a, "/steps/step"), (std::vector<double>{0, 1}));
  for (double v : read_column(a, "/steps/loss")) EXPECT_GT(v, 0);
  EXPECT_EQ(read_attribute(a, "stage"), comm->rank());
  // The measured times are recorded, and the head (a 50k-wide vocabulary on a 32-wide model) is
  // the costliest layer.
  EXPECT_GT(read_attribute(a, "layer_time_head_s"), read_attribute(a, "layer_time_block_s"));
  EXPECT_FALSE(read_column(a, "/actions/op").empty());
  const std::string stage_ckpt = dir + "/a/checkpoint/stage" + std::to_string(comm->rank());
  EXPECT_EQ(model::read_train_state(stage_ckpt).step, 2);
  const auto saved = model::checkpoint_range(stage_ckpt);
  EXPECT_EQ(read_attribute(a, "layer_begin"), saved.begin);
  EXPECT_EQ(read_attribute(a, "layer_end"), saved.end);

  // --partition uniform would cut 4 blocks differently from the measured split (which puts the
  // costly head alone or nearly so): the resumed run must keep the checkpoint's split.
  auto resumed = config("b", 3, "uniform");
  resumed.output.resume = dir + "/a/checkpoint";
  ASSERT_EQ(train_pipeline(resumed, topo), 0);
  EXPECT_EQ(read_column(rank_file("b"), "/steps/step"), (std::vector<double>{2}));
  EXPECT_EQ(read_attribute(rank_file("b"), "layer_begin"), saved.begin);
  EXPECT_EQ(read_attribute(rank_file("b"), "layer_end"), saved.end);

  ASSERT_EQ(train_pipeline(config("c", 3, "uniform"), topo), 0);
  expect_resume_continues_the_run(1e-5);
}

// Two stages per rank (rank r runs stages r and r + n): every stage gets its checkpoint, the
// actions name both stages, and the resumed run continues the uninterrupted one.
TEST_F(PipelineTrainer, InterleavedTrainsCheckpointsEveryStageAndResumes) {
  const int n = comm->size();
  const auto interleaved = [&](const std::string& out, int64_t steps) {
    auto c = TrainerTest::config(out, steps, /*blocks=*/8);  // 4 ranks x 2 stages fit
    c.pipeline.mode = gpt2p::parallel::PipelineMode::kPipeline;
    c.pipeline.schedule = gpt2p::pipeline::ScheduleKind::kInterleaved;
    c.pipeline.stages_per_rank = 2;
    c.pipeline.microbatches = n;  // a multiple of the ranks dividing the batch of 12
    c.pipeline.partition = gpt2p::pipeline::PartitionKind::kBalanced;
    return c;
  };
  ASSERT_EQ(train_pipeline(interleaved("a", 2), topo), 0);
  const auto a = rank_file("a");
  EXPECT_EQ(read_attribute(a, "stages_per_rank"), 2);
  std::set<double> stages;
  for (double s : read_column(a, "/actions/stage")) stages.insert(s);
  EXPECT_EQ(stages, (std::set<double>{static_cast<double>(comm->rank()),
                                      static_cast<double>(comm->rank() + n)}));
  for (int s : {comm->rank(), comm->rank() + n}) {
    const std::string ckpt = dir + "/a/checkpoint/stage" + std::to_string(s);
    EXPECT_EQ(model::read_train_state(ckpt).step, 2) << ckpt;
  }
  auto resumed = interleaved("b", 3);
  resumed.output.resume = dir + "/a/checkpoint";
  ASSERT_EQ(train_pipeline(resumed, topo), 0);
  ASSERT_EQ(train_pipeline(interleaved("c", 3), topo), 0);
  expect_resume_continues_the_run(1e-5);
}

// Every rank refuses the same bad interleaved setups with the same message (no rank is left
// waiting): M not a multiple of the ranks, and a checkpoint written with another stage count.
TEST_F(PipelineTrainer, InterleavedRefusesMNotAMultipleOfTheRanksAndAForeignCheckpoint) {
  const int n = comm->size();
  auto c = TrainerTest::config("bad", 1, /*blocks=*/8);
  c.pipeline.schedule = gpt2p::pipeline::ScheduleKind::kInterleaved;
  c.pipeline.stages_per_rank = 2;
  c.pipeline.microbatches = n == 2 ? 3 : 2;  // divides the batch of 12, not a multiple of the ranks
  try {
    train_pipeline(c, topo);
    ADD_FAILURE() << "M = " << c.pipeline.microbatches << " on " << n << " ranks should fail";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("is not a multiple of the " + std::to_string(n) + " ranks"),
        std::string::npos)
        << e.what();
  }
  // A one-stage-per-rank checkpoint has n stages, not the 2n an interleaved resume needs.
  auto plain = config("plain", 1, "balanced");
  plain.output.save_every = 1;
  ASSERT_EQ(train_pipeline(plain, topo), 0);
  auto resumed = TrainerTest::config("resumed", 2, /*blocks=*/8);
  resumed.pipeline.schedule = gpt2p::pipeline::ScheduleKind::kInterleaved;
  resumed.pipeline.stages_per_rank = 2;
  resumed.pipeline.microbatches = n;
  resumed.output.resume = dir + "/plain/checkpoint";
  try {
    train_pipeline(resumed, topo);
    ADD_FAILURE() << "resuming " << n << " stages as " << 2 * n << " should fail";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("holds " + std::to_string(n) + " stages, this run has " +
                                         std::to_string(2 * n)),
              std::string::npos)
        << e.what();
  }
}

// The head at the target positions only (the default) against the head at every position: the
// same losses step by step (the rows that are left out have weight 0).
TEST_F(PipelineTrainer, LossPositionsTargetsAndAllTrainTheSame) {
  auto all = config("all", 3, "uniform");
  all.compute.loss_positions = gpt2p::model::LossPositions::kAll;
  ASSERT_EQ(train_pipeline(config("targets", 3, "uniform"), topo), 0);
  ASSERT_EQ(train_pipeline(all, topo), 0);
  expect_same_losses("targets", "all", 3);
}

TEST_F(PipelineTrainer, ZeroBubbleTrainsLikeThePlainSchedule) {
  auto zb = config("zb", 3, "balanced");
  zb.pipeline.zero_bubble = true;
  auto zb_inf = config("zb_inf", 3, "balanced");  // every W as late as it helps: another order
  zb_inf.pipeline.zero_bubble = true;
  zb_inf.pipeline.zb_extra_live = -1;
  ASSERT_EQ(train_pipeline(config("plain", 3, "balanced"), topo), 0);
  ASSERT_EQ(train_pipeline(zb, topo), 0);
  ASSERT_EQ(train_pipeline(zb_inf, topo), 0);
  expect_same_losses("zb", "plain", 3);
  expect_same_losses("zb_inf", "plain", 3);
  // The timing file records the W actions (op 7), one per B.
  const auto ops = read_column(rank_file("zb"), "/actions/op");
  const auto count = [&](double op) { return std::count(ops.begin(), ops.end(), op); };
  EXPECT_GT(count(7), 0);
  EXPECT_EQ(count(7), count(1));
}

}  // namespace
}  // namespace gpt2p::parallel

namespace gpt2p::parallel {
namespace {

// --dp D: D replicas of a P-rank pipeline, each on its share of the global batch. With P = 1 that
// is data parallelism, and trains as dp_train does on the same ranks (the same global batches):
// the same global losses step by step. With P = 2 (4 ranks) and P = 1 otherwise: rank files that
// name each rank's place in the grid, and a --resume (replica 0 writes the stages, every replica's
// generator states go with them) that continues exactly as a run that never stopped.
TEST_F(PipelineTrainer, HybridTrainsAsDataParallelAndResumes) {
  const int n = comm->size();
  auto as_dp = config("pp-dp", 3, "balanced");
  as_dp.pipeline.dp = n;
  as_dp.pipeline.microbatches = 1;  // a replica's 12 / n rows
  ASSERT_EQ(train_pipeline(as_dp, topo), 0);
  ASSERT_EQ(
      train_data_parallel(TrainerTest::config("dp", 3, /*blocks=*/4), Program::kDataParallel, topo),
      0);
  // dp_train records each rank's own loss; pp_train the global batch's, their mean.
  const auto global = read_column(rank_file("pp-dp"), "/steps/loss");
  ASSERT_EQ(global.size(), 3U);
  for (size_t i = 0; i < global.size(); ++i) {
    double mean = 0;
    for (int r = 0; r < n; ++r) {
      mean += read_column(dir + "/dp/rank" + std::to_string(r) + ".h5", "/steps/loss").at(i) / n;
    }
    EXPECT_NEAR(global[i], mean, 1e-5 * mean) << "step " << i;
  }

  const int dp = n >= 4 && n % 2 == 0 ? 2 : n, pp = n / dp;
  const auto hybrid = [&](const std::string& out, int64_t steps) {
    auto c = config(out, steps, "balanced");
    c.pipeline.dp = dp;
    return c;
  };
  auto a = hybrid("a", 2);
  a.output.save_every = 2;
  ASSERT_EQ(train_pipeline(a, topo), 0);
  auto b = hybrid("b", 3);
  b.output.resume = dir + "/a/checkpoint";
  ASSERT_EQ(train_pipeline(b, topo), 0);
  ASSERT_EQ(train_pipeline(hybrid("c", 3), topo), 0);
  expect_resume_continues_the_run(1e-5);
  const std::string c = rank_file("c");
  EXPECT_EQ(read_attribute(c, "dp"), dp);
  EXPECT_EQ(read_attribute(c, "pp"), pp);
  EXPECT_EQ(read_attribute(c, "dp_rank"), comm->rank() / pp);
  EXPECT_EQ(read_attribute(c, "pp_rank"), comm->rank() % pp);
  EXPECT_EQ(read_attribute(c, "stage"), comm->rank() % pp);
  // One checkpoint part per stage, written once, with the states of the stage's replicas.
  const std::string root = dir + "/a/checkpoint";
  EXPECT_EQ(model::read_checkpoint_manifest(root).value("stages", -1), pp);
  EXPECT_EQ(model::read_train_state(root + "/stage0").rank_rng_states.size(),
            static_cast<size_t>(dp));
  // A checkpoint of another D (its manifest says so) is refused: the data position would name
  // another batch.
  comm->barrier();
  if (comm->rank() == 0) {
    auto manifest = model::read_checkpoint_manifest(root);
    manifest["dp"] = dp + 1;
    model::write_checkpoint_manifest(root, manifest);
  }
  comm->barrier();
  auto other = hybrid("other", 3);
  other.output.resume = root;
  try {
    train_pipeline(other, topo);
    ADD_FAILURE() << "a checkpoint written with --dp " << dp + 1 << " must be refused";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("was written with --dp " + std::to_string(dp + 1)),
              std::string::npos)
        << e.what();
  }
}

// --save-every 2 over 3 steps commits step 3 too, every stage under one manifest.
TEST_F(PipelineTrainer, AFinishedRunCommitsItsLastStep) {
  auto c = config("last", 3, "uniform");
  c.output.save_every = 2;
  ASSERT_EQ(train_pipeline(c, topo), 0);
  const std::string root = dir + "/last/checkpoint";
  EXPECT_EQ(model::read_checkpoint_manifest(root).value("step", -1), 3);
  EXPECT_EQ(model::read_train_state(root + "/stage" + std::to_string(comm->rank())).step, 3);
}

// Every stage's checkpoint is one commit: a manifest at the root, no staging directory left, and
// a resume refuses a root without the manifest or with a stage at another step.
TEST_F(PipelineTrainer, StageCheckpointsAreCommittedTogether) {
  auto c = config("a", 3, "uniform");
  c.output.save_every = 1;
  ASSERT_EQ(train_pipeline(c, topo), 0);
  const std::string root = dir + "/a/checkpoint";
  EXPECT_EQ(model::read_checkpoint_manifest(root).value("step", -1), 3);
  EXPECT_FALSE(fs::exists(root + ".next"));
  for (int s = 0; s < comm->size(); ++s) {
    EXPECT_EQ(model::read_train_state(root + "/stage" + std::to_string(s)).step, 3) << s;
  }
  const auto expect_refused = [&](const std::string& fragment) {
    auto resumed = config("b", 4, "uniform");
    resumed.output.resume = root;
    try {
      train_pipeline(resumed, topo);
      ADD_FAILURE() << "the resume must be refused: " << fragment;
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  // A stage from another save (as a kill between two stages' writes used to leave).
  auto two = config("two", 2, "uniform");
  two.output.save_every = 1;
  ASSERT_EQ(train_pipeline(two, topo), 0);
  comm->barrier();
  if (comm->rank() == 0) {
    remove_tree(root + "/stage1");
    fs::copy(dir + "/two/checkpoint/stage1", root + "/stage1", fs::copy_options::recursive);
  }
  comm->barrier();
  expect_refused("stage 1 is at step 2 but the checkpoint was committed at step 3");
  comm->barrier();
  if (comm->rank() == 0) fs::remove(root + "/manifest.json");
  comm->barrier();
  expect_refused("not a committed checkpoint");
}

}  // namespace
}  // namespace gpt2p::parallel
