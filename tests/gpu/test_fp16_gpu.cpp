// --precision fp16 on CUDA (2 ranks sharing the GPU over NCCL, or a GPU each): autocast to float16
// with dynamic loss scaling (parallel/loss_scaler.h) in every trainer and mode. Each mode's losses
// stay within 1% of the same run in fp32 (float16 keeps ~3 decimal digits; the losses of this
// tiny model start near 10.8); training lowers the loss as fp32 does; and a step whose gradients
// one rank makes non-finite is skipped on every rank and counted in the rank files.
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <cmath>
#include <cstdlib>
#include <numeric>

#include "gpt2p/parallel/trainers/dp_trainer.h"
#include "gpt2p/parallel/trainers/pp_trainer.h"
#include "support/h5_read.h"
#include "support/trainer_fixture.h"

namespace gpt2p::parallel {
namespace {

using gpt2p::testing::read_column;

// Relative distance of an fp16 run's losses from fp32's that the tests allow.
constexpr double kFp16Tolerance = 1e-2;

class Fp16OnGpu : public gpt2p::testing::TrainerTest {
 protected:
  void SetUp() override {
    if (torch::cuda::device_count() < 1) GTEST_SKIP() << "needs a GPU";
    TrainerTest::SetUp();
  }
  TrainConfig in(TrainConfig c, model::Precision precision) const {
    c.output.out += std::string("-") + std::string(name_of(precision));
    c.compute.device = DeviceKind::kCuda;
    c.compute.precision = precision;
    c.output.save_every = -1;
    return c;
  }
  // Runs `c` in fp32 and fp16 with `train`; their losses within kFp16Tolerance, nothing skipped.
  template <class Train>
  void expect_fp16_near_fp32(const TrainConfig& c, size_t steps, Train train) const {
    ASSERT_EQ(train(in(c, model::Precision::kFp32)), 0);
    ASSERT_EQ(train(in(c, model::Precision::kFp16)), 0);
    const std::string base = c.output.out.substr(dir.size() + 1);
    const auto fp32 = read_column(rank_file(base + "-fp32"), "/steps/loss");
    const auto fp16 = read_column(rank_file(base + "-fp16"), "/steps/loss");
    ASSERT_EQ(fp32.size(), steps);
    ASSERT_EQ(fp16.size(), steps);
    for (size_t i = 0; i < steps; ++i) {
      EXPECT_NEAR(fp16[i], fp32[i], kFp16Tolerance * fp32[i]) << "step " << i;
    }
    for (double s : read_column(rank_file(base + "-fp16"), "/steps/skipped")) EXPECT_EQ(s, 0);
    for (double s : read_column(rank_file(base + "-fp16"), "/steps/loss_scale")) {
      EXPECT_EQ(s, 65536);
    }
  }
};

TEST_F(Fp16OnGpu, DataParallelStaysNearFp32) {
  for (int zero : {0, 1}) {
    SCOPED_TRACE("zero " + std::to_string(zero));
    auto c = config(std::string("dp-zero") + std::to_string(zero), 4);
    c.data_parallel.bucket_mb = 0.05;
    c.data_parallel.zero = zero;
    c.compute.recompute = zero == 1 ? model::Recompute::kBlocks : model::Recompute::kNone;
    expect_fp16_near_fp32(c, 4, [&](const TrainConfig& run) {
      return train_data_parallel(run, Program::kDataParallel, topo);
    });
  }
}

TEST_F(Fp16OnGpu, EveryPipelineScheduleStaysNearFp32) {
  const int n = comm->size();
  struct Case {
    const char* name;
    pipeline::ScheduleKind schedule;
    int microbatches;
    bool zero_bubble;
    int dp;
    int zero;
  };
  using pipeline::ScheduleKind;
  const Case cases[] = {{"gpipe", ScheduleKind::kGPipe, 4, false, 1, 0},
                        {"1f1b-zb", ScheduleKind::kOneFOneB, 4, true, 1, 0},
                        {"interleaved", ScheduleKind::kInterleaved, 2 * n, false, 1, 0},
                        {"hybrid-zero", ScheduleKind::kOneFOneB, 2, false, 2, 1}};
  for (const auto& k : cases) {
    if (12 % (k.microbatches * k.dp) != 0 || n % k.dp != 0) continue;
    SCOPED_TRACE(k.name);
    auto c = config(std::string("pp-") + k.name, 4, /*blocks=*/8);
    c.pipeline.schedule = k.schedule;
    c.pipeline.microbatches = k.microbatches;
    c.pipeline.zero_bubble = k.zero_bubble;
    c.pipeline.dp = k.dp;
    c.data_parallel.zero = k.zero;
    c.pipeline.stages_per_rank = k.schedule == ScheduleKind::kInterleaved ? 2 : 1;
    expect_fp16_near_fp32(c, 4, [&](const TrainConfig& run) { return train_pipeline(run, topo); });
  }
}

// Eight epochs of the 64 pairs at --lr 1e-2 (about 10.8 to 4 in fp32 on CPU ranks): fp16 lowers
// the loss as fp32 does. At this rate the two runs' rounding sends them on their own paths: the
// last five steps' mean loss and the last validation loss agree within 15%.
TEST_F(Fp16OnGpu, TrainingLowersTheLossAsFp32Does) {
  auto c = config("learn", 0);
  c.optim.epochs = 8;
  c.optim.lr = 1e-2;
  c.output.translate_samples = 0;
  for (auto p : {model::Precision::kFp32, model::Precision::kFp16}) {
    ASSERT_EQ(train_data_parallel(in(c, p), Program::kDataParallel, topo), 0);
  }
  const auto mean_of_last = [](const std::vector<double>& v, size_t k) {
    return std::accumulate(v.end() - static_cast<std::ptrdiff_t>(k), v.end(), 0.0) / k;
  };
  const auto fp32 = read_column(rank_file("learn-fp32"), "/steps/loss");
  const auto fp16 = read_column(rank_file("learn-fp16"), "/steps/loss");
  ASSERT_EQ(fp16.size(), fp32.size());
  ASSERT_GE(fp16.size(), 20U);
  EXPECT_LT(mean_of_last(fp16, 5), fp16.front() - 4.0) << "from " << fp16.front();
  EXPECT_NEAR(mean_of_last(fp16, 5), mean_of_last(fp32, 5), 0.15 * mean_of_last(fp32, 5));
  const auto val32 = read_column(rank_file("learn-fp32"), "/epochs/val_loss");
  const auto val16 = read_column(rank_file("learn-fp16"), "/epochs/val_loss");
  EXPECT_NEAR(val16.back(), val32.back(), 0.15 * val32.back());
}

TEST_F(Fp16OnGpu, AnOverflowOnOneRankSkipsTheStepEverywhere) {
  auto c = in(config("overflow", 3), model::Precision::kFp16);
  c.data_parallel.bucket_mb = 0.05;
  const std::string fault = std::to_string(comm->size() - 1) + ":1";
  ::setenv("GPT2P_INJECT_NONFINITE_GRADS", fault.c_str(), 1);
  const int rc = train_data_parallel(c, Program::kDataParallel, topo);
  ::unsetenv("GPT2P_INJECT_NONFINITE_GRADS");
  ASSERT_EQ(rc, 0);
  EXPECT_EQ(read_column(rank_file("overflow-fp16"), "/steps/skipped"),
            (std::vector<double>{0, 1, 0}));
  EXPECT_EQ(read_column(rank_file("overflow-fp16"), "/steps/loss_scale"),
            (std::vector<double>{65536, 65536, 32768}));
}

}  // namespace
}  // namespace gpt2p::parallel
