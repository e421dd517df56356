// Dynamic loss scaling (parallel/loss_scaler.h) in the trainers at 2 and 4 ranks, on CPU ranks in
// float32, where a power-of-two scale is exact: dp_train (bucketed, per-parameter, ZeRO-1) and
// pp_train (gpipe, 1F1B, zero bubble, interleaved, recompute, the hybrid with and without ZeRO-1)
// train to the same bits with scaling as without; a step whose gradients one rank makes
// non-finite is skipped on every rank, leaving the weights as they were and halving the scale;
// and a resume continues the scale where the checkpoint left it.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>

#include "gpt2p/model/checkpoint.h"
#include "gpt2p/parallel/trainers/dp_trainer.h"
#include "gpt2p/parallel/trainers/pp_trainer.h"
#include "support/h5_read.h"
#include "support/trainer_fixture.h"

namespace gpt2p::parallel {
namespace {

namespace fs = std::filesystem;
using gpt2p::testing::read_column;

// The bytes of every model.safetensors under `root`, by path relative to it.
std::map<std::string, std::string> weight_files(const std::string& root) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    if (e.path().filename() != "model.safetensors") continue;
    std::ifstream in(e.path(), std::ios::binary);
    out[fs::relative(e.path(), root).string()] =
        std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return out;
}

class LossScaleTrainer : public gpt2p::testing::TrainerTest {
 protected:
  struct Mode {
    const char* name;
    bool pipeline;
    int zero = 0;
    GradSyncMode sync = GradSyncMode::kBucketed;
    int grad_accum = 1;
    pipeline::ScheduleKind schedule = pipeline::ScheduleKind::kOneFOneB;
    int microbatches = 2;
    bool zero_bubble = false;
    int dp = 1;
    model::Recompute recompute = model::Recompute::kNone;
  };

  // Every mode this job's size can run.
  std::vector<Mode> modes() const {
    using pipeline::ScheduleKind;
    const int n = comm->size();
    std::vector<Mode> all = {
        {"dp", false},
        {"dp-per-param-accum", false, 0, GradSyncMode::kPerParam, 2},
        {"dp-zero", false, 1},
        {"gpipe", true, 0, GradSyncMode::kBucketed, 1, ScheduleKind::kGPipe, 4},
        {"1f1b-zb", true, 0, GradSyncMode::kBucketed, 1, ScheduleKind::kOneFOneB, 4, true},
        {"interleaved", true, 0, GradSyncMode::kBucketed, 1, ScheduleKind::kInterleaved, 2 * n},
        {"1f1b-recompute", true, 0, GradSyncMode::kBucketed, 1, ScheduleKind::kOneFOneB, 4, false,
         1, model::Recompute::kBlocks},
        {"hybrid", true, 0, GradSyncMode::kBucketed, 1, ScheduleKind::kOneFOneB, 2, false, 2},
        {"hybrid-zero", true, 1, GradSyncMode::kBucketed, 1, ScheduleKind::kOneFOneB, 2, false, 2}};
    std::vector<Mode> out;
    for (const auto& m : all) {
      if (m.pipeline && (12 % (m.microbatches * m.dp) != 0 || n % m.dp != 0 || n / m.dp < 2)) {
        continue;
      }
      if (!m.pipeline && (12 / n) % m.grad_accum != 0) continue;
      out.push_back(m);
    }
    return out;
  }

  TrainConfig mode_config(const Mode& m, const std::string& out, int64_t steps) const {
    auto c = config(out, steps, m.pipeline ? 8 : 2);
    c.model.dropout = 0.1;
    c.data_parallel.bucket_mb = 0.05;
    c.data_parallel.zero = m.zero;
    c.data_parallel.grad_sync = m.sync;
    c.optim.grad_accum = m.grad_accum;
    c.pipeline.schedule = m.schedule;
    c.pipeline.microbatches = m.microbatches;
    c.pipeline.zero_bubble = m.zero_bubble;
    c.pipeline.dp = m.dp;
    c.pipeline.stages_per_rank = m.schedule == pipeline::ScheduleKind::kInterleaved ? 2 : 1;
    c.compute.recompute = m.recompute;
    return c;
  }

  static TrainConfig scaled(TrainConfig c) {
    c.loss_scale.mode = LossScaleMode::kDynamic;
    c.loss_scale.init = 1024;
    c.loss_scale.window = 2;
    return c;
  }

  int train(const Mode& m, const TrainConfig& c) const {
    return m.pipeline ? train_pipeline(c, topo)
                      : train_data_parallel(c, Program::kDataParallel, topo);
  }
};

TEST_F(LossScaleTrainer, EveryModeTrainsToTheSameBitsWithAPowerOfTwoScale) {
  for (const auto& m : modes()) {
    SCOPED_TRACE(m.name);
    const std::string plain = std::string(m.name) + "-plain",
                      scale = std::string(m.name) + "-scaled";
    ASSERT_EQ(train(m, mode_config(m, plain, 4)), 0);
    ASSERT_EQ(train(m, scaled(mode_config(m, scale, 4))), 0);
    const auto a = read_column(rank_file(plain), "/steps/loss");
    const auto b = read_column(rank_file(scale), "/steps/loss");
    ASSERT_EQ(a.size(), 4U);
    ASSERT_EQ(b.size(), 4U);
    for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(b[i], a[i]) << "step " << i;
    // Two good steps double the scale; nothing skipped; without scaling the scale is 1.
    EXPECT_EQ(read_column(rank_file(scale), "/steps/loss_scale"),
              (std::vector<double>{1024, 1024, 2048, 2048}));
    EXPECT_EQ(read_column(rank_file(scale), "/steps/skipped"), (std::vector<double>{0, 0, 0, 0}));
    EXPECT_EQ(read_column(rank_file(plain), "/steps/loss_scale"),
              (std::vector<double>{1, 1, 1, 1}));
    EXPECT_EQ(weight_files(dir + "/" + plain + "/checkpoint"),
              weight_files(dir + "/" + scale + "/checkpoint"));
  }
}

TEST_F(LossScaleTrainer, AStepWithNonFiniteGradientsOnOneRankIsSkippedOnAll) {
  const std::string fault = std::to_string(comm->size() - 1) + ":1";
  for (const auto& m : modes()) {
    SCOPED_TRACE(m.name);
    const std::string one = std::string(m.name) + "-one", skip = std::string(m.name) + "-skip";
    ASSERT_EQ(train(m, scaled(mode_config(m, one, 1))), 0);
    ::setenv("GPT2P_INJECT_NONFINITE_GRADS", fault.c_str(), 1);
    const int rc = train(m, scaled(mode_config(m, skip, 2)));
    ::unsetenv("GPT2P_INJECT_NONFINITE_GRADS");
    ASSERT_EQ(rc, 0);
    EXPECT_EQ(read_column(rank_file(skip), "/steps/skipped"), (std::vector<double>{0, 1}));
    EXPECT_EQ(read_column(rank_file(skip), "/steps/loss_scale"), (std::vector<double>{1024, 1024}));
    // The skipped step left every weight as the one-step run's.
    const auto after_one = weight_files(dir + "/" + one + "/checkpoint");
    ASSERT_FALSE(after_one.empty());
    EXPECT_EQ(weight_files(dir + "/" + skip + "/checkpoint"), after_one);
    const std::string ck = dir + "/" + skip + "/checkpoint" + (m.pipeline ? "/stage0" : "");
    const auto state = model::read_train_state(ck);
    EXPECT_EQ(state.step, 2);
    EXPECT_EQ(state.loss_scale, 512);
    EXPECT_EQ(state.skipped_steps, 1);
    EXPECT_EQ(state.loss_scale_good_steps, 0);
  }
}

TEST_F(LossScaleTrainer, AResumeContinuesTheScale) {
  for (const auto& m : modes()) {
    if (std::string(m.name) != "dp" && std::string(m.name) != "hybrid-zero" &&
        std::string(m.name) != "gpipe") {
      continue;
    }
    SCOPED_TRACE(m.name);
    const std::string p = std::string(m.name) + "-";
    ASSERT_EQ(train(m, scaled(mode_config(m, p + "a", 2))), 0);
    auto resumed = scaled(mode_config(m, p + "b", 3));
    resumed.output.resume = dir + "/" + p + "a/checkpoint";
    ASSERT_EQ(train(m, resumed), 0);
    ASSERT_EQ(train(m, scaled(mode_config(m, p + "c", 3))), 0);
    const auto full = read_column(rank_file(p + "c"), "/steps/loss");
    const auto rest = read_column(rank_file(p + "b"), "/steps/loss");
    ASSERT_EQ(full.size(), 3U);
    ASSERT_EQ(rest.size(), 1U);
    EXPECT_EQ(rest[0], full[2]);
    EXPECT_EQ(read_column(rank_file(p + "b"), "/steps/loss_scale"), (std::vector<double>{2048}));
    EXPECT_EQ(read_column(rank_file(p + "c"), "/steps/loss_scale")[2], 2048);
  }
}

}  // namespace
}  // namespace gpt2p::parallel
