// Predicted step times: the textbook results for equal stages, and what the cost of the slowest
// stage and of transfers does to them.
#include <gtest/gtest.h>

#include "gpt2p/core/error.h"
#include "gpt2p/pipeline/perf/predict.h"
#include "support/errors.h"

namespace gpt2p::pipeline {
namespace {

using testing::error_of;

// n stages of 3 equal layers... plus embedding and head as free layers: every stage costs 3.
std::vector<double> equal_stage_costs(int n) {
  std::vector<double> costs(static_cast<size_t>(n) + 2, 3.0);
  costs.front() = 0.0;
  costs.back() = 0.0;
  return costs;
}

TEST(Predict, EqualStagesGiveGPipesBubble) {
  for (int n : {2, 3, 4}) {
    const auto costs = equal_stage_costs(n);
    const auto split = partition_balanced(costs, n);
    for (int m : {1, 2, 4, 8}) {
      SCOPED_TRACE("n=" + std::to_string(n) + " m=" + std::to_string(m));
      const auto p = predict_step(ScheduleKind::kGPipe, m, split, costs);
      // (m + n - 1) ticks of forward (1) and of backward (2).
      EXPECT_NEAR(p.step, 3.0 * (m + n - 1), 1e-9);
      EXPECT_NEAR(p.bubble, (n - 1.0) / (m + n - 1.0), 1e-9);
      ASSERT_EQ(p.stage_busy.size(), static_cast<size_t>(n));
      EXPECT_NEAR(p.stage_busy[0], 3.0 * m, 1e-9);
      // 1F1B has the same makespan as GPipe with equal stages and free transfers.
      EXPECT_NEAR(predict_step(ScheduleKind::kOneFOneB, m, split, costs).step, p.step, 1e-9);
    }
  }
}

TEST(Predict, OneMicroBatchIsTheSumOfTheStages) {
  const std::vector<double> costs{0.5, 2.0, 2.0, 2.0, 6.0};  // embedding, 3 blocks, head
  const Partition split{{0, 2}, {2, 5}};                     // 2.5 | 10
  const auto p = predict_step(ScheduleKind::kGPipe, 1, split, costs);
  EXPECT_NEAR(p.step, 12.5, 1e-9);
  EXPECT_NEAR(p.bubble, 1.0 - 12.5 / (2 * 12.5), 1e-9);
}

TEST(Predict, TheSlowestStageSetsTheSteadyState) {
  // Stage costs 2 and 4: with many micro-batches the step approaches m x 4.
  const std::vector<double> costs{0.0, 2.0, 4.0, 0.0};
  const Partition split{{0, 2}, {2, 4}};
  const auto p = predict_step(ScheduleKind::kOneFOneB, 16, split, costs);
  EXPECT_GE(p.step, 16 * 4.0);
  EXPECT_LE(p.step, 16 * 4.0 + 2.0 + 1e-9);  // plus one pass through the faster stage
}

TEST(Predict, TransfersAddToTheCriticalPath) {
  const auto costs = equal_stage_costs(2);
  const auto split = partition_balanced(costs, 2);
  const double free = predict_step(ScheduleKind::kGPipe, 4, split, costs).step;
  const double paid = predict_step(ScheduleKind::kGPipe, 4, split, costs, {0.5}).step;
  EXPECT_GE(paid, free + 2 * 0.5);  // at least one activation and one gradient on the path
}

// The per-call overhead is paid once per stage and micro-batch, whatever the stage holds: on one
// stage, m micro-batches cost m x (layers + overhead).
TEST(Predict, StageOverheadIsPaidPerStageAndMicroBatch) {
  const std::vector<double> costs{0.5, 2.0, 2.0, 2.0, 6.0};
  const Partition one{{0, 5}};
  StepModel model;
  model.stage_overhead = 0.25;
  EXPECT_NEAR(predict_step(ScheduleKind::kOneFOneB, 4, one, costs, model).step, 4 * 12.75, 1e-9);
  // Two stages pay it twice per micro-batch: model parallelism costs 12.5 + 2 x 0.25.
  const Partition two{{0, 2}, {2, 5}};
  EXPECT_NEAR(predict_step(ScheduleKind::kGPipe, 1, two, costs, model).step, 13.0, 1e-9);
  model.stage_overhead = -1;
  EXPECT_NE(error_of([&] { predict_step(ScheduleKind::kGPipe, 1, two, costs, model); })
                .find("stage overhead -1 < 0"),
            std::string::npos);
}

TEST(Predict, ZeroBubbleFillsTheBubbleWithWeightGradients) {
  for (int n : {2, 3, 4}) {
    const auto costs = equal_stage_costs(n);
    const auto split = partition_balanced(costs, n);
    for (int m : {2, 4, 8}) {
      SCOPED_TRACE("n=" + std::to_string(n) + " m=" + std::to_string(m));
      StepModel zb;
      zb.zero_bubble = true;
      zb.block_weight_share = 1.0 / 3.0;  // F 1, B 1, W 1 per stage
      const auto plain = predict_step(ScheduleKind::kOneFOneB, m, split, costs);
      const auto split_bw = predict_step(ScheduleKind::kOneFOneB, m, split, costs, zb);
      EXPECT_LT(split_bw.step, plain.step) << "W's fill the cool-down";
      EXPECT_GE(split_bw.step, 3.0 * m - 1e-9) << "no faster than the busy time";
      for (double busy : split_bw.stage_busy) EXPECT_NEAR(busy, 3.0 * m, 1e-9);
      // With no W to move, the split changes nothing.
      zb.block_weight_share = 0.0;
      EXPECT_NEAR(predict_step(ScheduleKind::kOneFOneB, m, split, costs, zb).step, plain.step,
                  1e-9);
    }
  }
}

TEST(Predict, BadInputSaysWhatToPass) {
  const auto costs = equal_stage_costs(2);
  const auto split = partition_balanced(costs, 2);
  EXPECT_NE(error_of([&] {
              predict_step(ScheduleKind::kGPipe, 0, split, costs);
            }).find("0 micro-batches"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              predict_step(ScheduleKind::kGPipe, 2, split, costs, {0.0, 1.0});
            }).find("forward_share 1"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              predict_step(ScheduleKind::kGPipe, 2, split, {1.0, 2.0});
            }).find("stage_costs"),
            std::string::npos);
}

}  // namespace
}  // namespace gpt2p::pipeline
