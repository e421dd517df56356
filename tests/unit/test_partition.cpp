// Stage partitioning: HW5's uniform split, the exact balanced split, and the FLOP cost model.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gpt2p/core/error.h"
#include "gpt2p/pipeline/plan/partition.h"
#include "gpt2p/pipeline/plan/zero_bubble.h"
#include "support/errors.h"

namespace gpt2p::pipeline {
namespace {

using gpt2p::testing::error_of;

// GPT-2 small (124M) at its full context.
std::vector<double> gpt2_small_costs(int seq_len = 1024) {
  return layer_costs_flops(12, 768, 12, seq_len, 50257);
}

// Every contiguous split of n_layers layers into n_stages non-empty stages, as stage begins.
void for_each_split(int n_layers, int n_stages, const std::function<void(const Partition&)>& f) {
  std::vector<int> begins(n_stages, 0);
  std::function<void(int)> rec = [&](int k) {
    if (k == n_stages) {
      Partition p(n_stages);
      for (int s = 0; s < n_stages; ++s) {
        p[s] = {begins[s], s + 1 < n_stages ? begins[s + 1] : n_layers};
      }
      f(p);
      return;
    }
    for (int b = begins[k - 1] + 1; b <= n_layers - (n_stages - k); ++b) {
      begins[k] = b;
      rec(k + 1);
    }
  };
  rec(1);
}

TEST(PartitionUniform, Gpt2SmallSplits) {
  EXPECT_EQ(to_string(partition_uniform(12, 1)), "0-13");
  EXPECT_EQ(to_string(partition_uniform(12, 2)), "0-6|7-13");
  EXPECT_EQ(to_string(partition_uniform(12, 3)), "0-4|5-8|9-13");
  EXPECT_EQ(to_string(partition_uniform(12, 4)), "0-3|4-6|7-9|10-13");
  // ceil(12/5) = 3 per stage: the last stage keeps only ln_f + head.
  EXPECT_EQ(to_string(partition_uniform(12, 5)), "0-3|4-6|7-9|10-12|13-13");
  EXPECT_EQ(to_string(partition_uniform(12, 12)),
            "0-1|2-2|3-3|4-4|5-5|6-6|7-7|8-8|9-9|10-10|"
            "11-11|12-13");
  // 13 blocks on 4 stages: 4, 4, 4, then the remaining 1.
  EXPECT_EQ(to_string(partition_uniform(13, 4)), "0-4|5-8|9-12|13-14");
}

TEST(PartitionUniform, CoversEveryLayerOnce) {
  for (int blocks = 1; blocks <= 48; ++blocks) {
    for (int n = 1; n <= blocks; ++n) {
      Partition p;
      try {
        p = partition_uniform(blocks, n);
      } catch (const gpt2p::Error&) {
        continue;  // a stage would be empty; tested below
      }
      ASSERT_EQ(static_cast<int>(p.size()), n);
      EXPECT_EQ(p.front().begin, 0);
      EXPECT_EQ(p.back().end, blocks + 2);
      for (int s = 0; s < n; ++s) {
        EXPECT_GT(p[s].size(), 0);
        if (s > 0) {
          EXPECT_EQ(p[s].begin, p[s - 1].end);
        }
        // Stages take ceil(blocks / n) blocks in order until none are left; the last takes the
        // rest. Blocks held = layers minus the embedding (stage 0) and the head (last stage).
        const int per = (blocks + n - 1) / n;
        const int left = std::max(0, blocks - s * per);
        const int expected = s < n - 1 ? std::min(per, left) : left;
        EXPECT_EQ(p[s].size() - (s == 0) - (s == n - 1), expected) << blocks << "/" << n;
      }
    }
  }
}

TEST(PartitionUniform, ErrorsNameTheNumbersAndTheFix) {
  std::string msg = error_of([] { partition_uniform(12, 13); });
  EXPECT_NE(msg.find("n_stages = 13 is more than the model's n_blocks = 12"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("run at most 12 pipeline stages"), std::string::npos) << msg;
  msg = error_of([] { partition_uniform(12, 8); });
  EXPECT_NE(msg.find("12 blocks at ceil(12/8) = 2 per stage leave stage 6 of 8 without any "
                     "layer"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("balanced partition"), std::string::npos) << msg;
  EXPECT_NE(error_of([] { partition_uniform(12, 0); }).find("n_stages = 0 < 1"), std::string::npos);
}

TEST(LayerCostsFlops, Gpt2Small) {
  const std::vector<double> c = gpt2_small_costs();
  ASSERT_EQ(c.size(), 14u);
  EXPECT_EQ(c[0], 0.0);
  for (int i = 1; i <= 12; ++i) EXPECT_EQ(c[i], 53150220288.0);  // 3 (24 T C^2 + 4 T^2 C)
  EXPECT_EQ(c[13], 237142278144.0);                              // 3 (2 T C V)
  // The 50257-wide head costs about 4.5 blocks at T = 1024.
  EXPECT_NEAR(c[13] / c[1], 4.46, 0.01);
  const std::string msg = error_of([] { layer_costs_flops(12, 768, 7, 1024, 50257); });
  EXPECT_NE(msg.find("n_embd 768 is not a multiple of n_head 7"), std::string::npos) << msg;
  EXPECT_NE(error_of([] { layer_costs_flops(0, 768, 12, 1024, 50257); }).find("n_layer 0"),
            std::string::npos);
}

TEST(PartitionBalanced, Gpt2SmallOnTwoStagesMovesBlocksAwayFromTheHead) {
  const std::vector<double> c = gpt2_small_costs();
  const Partition balanced = partition_balanced(c, 2);
  // 8 blocks + embedding | 4 blocks + head: 8 x 53.2 vs 4 x 53.2 + 237.1 GFLOP.
  EXPECT_EQ(to_string(balanced), "0-8|9-13");
  EXPECT_NE(balanced, partition_uniform(12, 2));
  EXPECT_LT(max_stage_cost(c, balanced), max_stage_cost(c, partition_uniform(12, 2)));
  EXPECT_DOUBLE_EQ(max_stage_cost(c, balanced), 4 * 53150220288.0 + 237142278144.0);
}

TEST(PartitionBalanced, MeasuredTimesAndSingleStage) {
  const std::vector<double> ms = {0.1, 1.0, 1.0, 1.0, 1.0, 5.0};
  EXPECT_EQ(to_string(partition_balanced(ms, 2)), "0-4|5-5");
  EXPECT_EQ(to_string(partition_balanced(ms, 1)), "0-5");
  EXPECT_EQ(stage_costs(ms, partition_balanced(ms, 2)), (std::vector<double>{4.1, 5.0}));
}

TEST(PartitionBalanced, TiesMakeEarlierStagesLighter) {
  EXPECT_EQ(to_string(partition_balanced({0, 1, 1, 1, 0}, 2)), "0-1|2-4");
  EXPECT_EQ(to_string(partition_balanced(std::vector<double>(14, 1.0), 2)), "0-6|7-13");
  EXPECT_EQ(to_string(partition_balanced(std::vector<double>(14, 1.0), 4)), "0-1|2-5|6-9|10-13");
}

// n_layers integer costs in [0, 9]: exact sums, so ties are real ties.
std::vector<double> random_costs(std::mt19937& rng, int n_layers) {
  std::uniform_int_distribution<int> small(0, 9);
  std::vector<double> c(n_layers);
  for (double& x : c) x = small(rng);
  return c;
}

TEST(PartitionBalanced, ExactAgainstBruteForce) {
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 200; ++trial) {
    const int n_layers = 3 + trial % 8;
    const std::vector<double> c = random_costs(rng, n_layers);
    for (int n = 1; n <= n_layers - 2; ++n) {
      const Partition got = partition_balanced(c, n);
      const double got_max = max_stage_cost(c, got);
      double best = 1e300;
      Partition preferred;  // optimal, with the latest stages taking the most layers
      for_each_split(n_layers, n, [&](const Partition& p) {
        const double m = max_stage_cost(c, p);
        auto later_heavier = [&] {
          for (int s = n - 1; s >= 1; --s) {
            if (p[s].begin != preferred[s].begin) return p[s].begin < preferred[s].begin;
          }
          return false;
        };
        if (m < best || (m == best && later_heavier())) {
          best = m;
          preferred = p;
        }
      });
      ASSERT_EQ(got_max, best) << "trial " << trial << " n=" << n;
      ASSERT_EQ(to_string(got), to_string(preferred)) << "trial " << trial << " n=" << n;
    }
  }
}

// Interleaved (2 ranks x 2 stages, rank 1 runs stages 1 and 3). A head of 4.4 blocks alone on the
// last stage with 4 blocks beside it on rank 1 balances the ranks at 8.4 against 8.1. A head of
// 5.3 (the FLOP model's) needs 3 blocks beside it (8.3 against 9.1), where partition_balanced's
// split (smallest largest stage) loads rank 1 with 5 blocks + the head (10.3 against 7.1).
TEST(PartitionInterleaved, BalancesTheRanksThenTheStages) {
  std::vector<double> c(14, 1.0);
  c.front() = 0.1;
  c.back() = 4.4;
  EXPECT_EQ(to_string(partition_interleaved(c, 2, 2)), "0-4|5-8|9-12|13-13");
  EXPECT_EQ(to_string(partition_interleaved(c, 2, 1)), to_string(partition_balanced(c, 2)));
  c.back() = 5.3;
  EXPECT_EQ(to_string(partition_interleaved(c, 2, 2)), "0-4|5-7|8-12|13-13");
  EXPECT_EQ(to_string(partition_balanced(c, 4)), "0-2|3-7|8-12|13-13");
}

// Against every split: the same (largest rank load, largest stage, sum of squared stage costs),
// and a largest rank load never above partition_balanced's split's.
TEST(PartitionInterleaved, ExactAgainstBruteForce) {
  std::mt19937 rng(4321);
  for (int trial = 0; trial < 100; ++trial) {
    const int n_layers = 6 + trial % 7;
    const std::vector<double> c = random_costs(rng, n_layers);
    for (int ranks = 2; ranks <= 3; ++ranks) {
      for (int v = 2; v <= 3 && ranks * v <= n_layers - 2; ++v) {
        const int n = ranks * v;
        const auto key = [&](const Partition& p) {
          const auto sc = stage_costs(c, p);
          std::vector<double> load(ranks, 0.0);
          double squares = 0.0;
          for (int s = 0; s < n; ++s) {
            load[s % ranks] += sc[s];
            squares += sc[s] * sc[s];
          }
          return std::make_tuple(*std::max_element(load.begin(), load.end()),
                                 *std::max_element(sc.begin(), sc.end()), squares);
        };
        std::tuple<double, double, double> best{1e300, 1e300, 1e300};
        for_each_split(n_layers, n, [&](const Partition& p) { best = std::min(best, key(p)); });
        const auto got = key(partition_interleaved(c, ranks, v));
        ASSERT_EQ(got, best) << "trial " << trial << " ranks=" << ranks << " v=" << v;
        const auto balanced = key(partition_balanced(c, n));
        EXPECT_LE(std::get<0>(got), std::get<0>(balanced));
      }
    }
  }
}

// A search cut short keeps the best split found, never worse than partition_balanced's.
TEST(PartitionInterleaved, ABudgetOfOneNodeKeepsTheBalancedSplit) {
  std::vector<double> c(14, 1.0);
  c.front() = 0.1;
  c.back() = 5.3;
  EXPECT_EQ(to_string(partition_interleaved(c, 2, 2, 1)), to_string(partition_balanced(c, 4)));
}

TEST(PartitionBalanced, NeverWorseThanUniform) {
  std::mt19937 rng(99);
  std::uniform_real_distribution<double> u(0.0, 3.0);
  for (int blocks = 1; blocks <= 24; ++blocks) {
    std::vector<std::vector<double>> cost_sets = {
        layer_costs_flops(blocks, 768, 12, 1024, 50257),
        layer_costs_flops(blocks, 256, 4, 64, 50257),
    };
    std::vector<double> random(blocks + 2);
    for (double& x : random) x = u(rng);
    cost_sets.push_back(random);
    for (int n = 1; n <= blocks; ++n) {
      Partition uniform;
      try {
        uniform = partition_uniform(blocks, n);
      } catch (const gpt2p::Error&) {
        continue;
      }
      for (const auto& c : cost_sets) {
        EXPECT_LE(max_stage_cost(c, partition_balanced(c, n)), max_stage_cost(c, uniform))
            << blocks << " blocks on " << n << " stages";
      }
    }
  }
}

TEST(PartitionBalanced, ErrorsNameTheNumbersAndTheFix) {
  const std::vector<double> c = gpt2_small_costs();
  std::string msg = error_of([&] { partition_balanced(c, 13); });
  EXPECT_NE(msg.find("partition_balanced: n_stages = 13 is more than the model's n_blocks = 12"),
            std::string::npos)
      << msg;
  msg = error_of([] { partition_balanced({1.0, 2.0}, 1); });
  EXPECT_NE(msg.find("2 layer costs given; expected L + 2 >= 3"), std::string::npos) << msg;
  msg = error_of([] { partition_balanced({1.0, -2.0, 1.0}, 1); });
  EXPECT_NE(msg.find("cost of layer 1 is -2"), std::string::npos) << msg;
  msg = error_of([&] { stage_costs(c, partition_uniform(11, 2)); });
  EXPECT_NE(msg.find("covers layers [0, 13) of 14"), std::string::npos) << msg;
}

TEST(ZeroBubbleCosts, BlocksSplitTheirBackwardAndTheHeadHasNoneLeft) {
  // 2 blocks, C = 4, T = 2, V = 10: a block is 24*2*16 = 768 (linears) + 4*4*4 = 64 (attention).
  const Partition split{{0, 2}, {2, 4}};  // embedding + h.0 | h.1 + head
  const auto c = zero_bubble_costs(split, 2, 4, 2, 10, 0.5);
  ASSERT_EQ(c.forward.size(), 2U);
  EXPECT_DOUBLE_EQ(c.forward[0], 768 + 64);
  EXPECT_DOUBLE_EQ(c.input_backward[0], 768 + 128);
  EXPECT_DOUBLE_EQ(c.weight_backward[0], 768);
  // The head: 3 GEMMs of 2 T C V at half the positions, all in the forward.
  EXPECT_DOUBLE_EQ(c.forward[1], 768 + 64 + 3 * 2 * 2 * 4 * 10 * 0.5);
  EXPECT_DOUBLE_EQ(c.input_backward[1], 768 + 128);
  EXPECT_DOUBLE_EQ(c.weight_backward[1], 768);
  // Forward + backward is 3 x forward for a block, as layer_costs_flops counts it.
  const auto flops = layer_costs_flops(2, 4, 1, 2, 10);
  EXPECT_DOUBLE_EQ(c.forward[0] + c.input_backward[0] + c.weight_backward[0], flops[1]);
}

TEST(ZeroBubbleCosts, RejectsSplitsThatDoNotCoverTheModel) {
  const auto gap = error_of([] { zero_bubble_costs({{0, 2}, {3, 4}}, 2, 4, 2, 10, 1); });
  EXPECT_NE(gap.find("does not continue the split at layer 2"), std::string::npos) << gap;
  const auto short_split = error_of([] { zero_bubble_costs({{0, 2}, {2, 3}}, 2, 4, 2, 10, 1); });
  EXPECT_NE(short_split.find("ends at layer 3 of 4"), std::string::npos) << short_split;
  EXPECT_NE(error_of([] {
              zero_bubble_costs({{0, 4}}, 2, 4, 2, 10, 0);
            }).find("loss fraction 0"),
            std::string::npos);
}

}  // namespace
}  // namespace gpt2p::pipeline
