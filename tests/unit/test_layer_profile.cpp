// The layer profile behind --partition measured: it times the real stage code on this device and
// turns the times into per-layer costs that the balanced split consumes.
#include <gtest/gtest.h>

#include <cmath>

#include "gpt2p/core/error.h"
#include "gpt2p/model/config.h"
#include "gpt2p/pipeline/layer_profile.h"
#include "gpt2p/pipeline/partition.h"
#include "support/errors.h"

namespace gpt2p::pipeline {
namespace {

using testing::error_of;

TEST(LayerProfile, TimesEveryPartOnTheCpu) {
  auto config = model::preset("tiny");
  config.dropout = 0.0;
  const LayerTimes t = measure_layer_times(config, /*micro_rows=*/2, /*seq_len=*/16,
                                           /*bf16=*/false, c10::kCPU, /*warmup=*/1,
                                           /*reps=*/2, /*rounds=*/2);
  for (double s : {t.embedding, t.block, t.head}) {
    EXPECT_TRUE(std::isfinite(s));
    EXPECT_GT(s, 0.0);
    EXPECT_LT(s, 10.0);  // seconds: a stuck or runaway loop, not a slow machine
  }
}

TEST(LayerProfile, Bf16AutocastRunsToo) {
  auto config = model::preset("tiny");
  const LayerTimes t = measure_layer_times(config, 1, 8, /*bf16=*/true, c10::kCPU, 0, 1, 1);
  EXPECT_GT(t.block, 0.0);
  EXPECT_GT(t.head, 0.0);
}

TEST(LayerProfile, CostsFollowThePartitionNumbering) {
  const LayerTimes t{0.5, 2.0, 7.0};
  const auto costs = layer_costs_from_times(t, 3);
  ASSERT_EQ(costs.size(), 5u);
  EXPECT_EQ(costs.front(), 0.5);
  for (int i = 1; i <= 3; ++i) EXPECT_EQ(costs[i], 2.0);
  EXPECT_EQ(costs.back(), 7.0);
}

// GPT-2 small on an H200 at 16 x 128: the head costs about 4.2 blocks (FLOPs say 5.3). Measured
// costs move the cut one block later than the FLOP model's 0-9|10-13.
TEST(LayerProfile, AMeasuredHeadMovesTheCut) {
  const auto measured = layer_costs_from_times({0.1, 1.0, 4.2}, 12);
  EXPECT_EQ(to_string(partition_balanced(measured, 2)), "0-8|9-13");
  const auto flops = layer_costs_flops(12, 768, 12, 128, 50304);
  EXPECT_EQ(to_string(partition_balanced(flops, 2)), "0-9|10-13");
}

TEST(LayerProfile, BadArgumentsSayWhatToPass) {
  const auto config = model::preset("tiny");
  EXPECT_NE(error_of([&] { measure_layer_times(config, 0, 8, false, c10::kCPU); })
                .find("micro_rows 0"),
            std::string::npos);
  EXPECT_NE(error_of([&] { measure_layer_times(config, 1, 8, false, c10::kCPU, 0, 0); })
                .find("reps 0"),
            std::string::npos);
  EXPECT_NE(error_of([] { layer_costs_from_times({}, 0); }).find("n_layer 0 < 1"),
            std::string::npos);
}

}  // namespace
}  // namespace gpt2p::pipeline
