// The roll call's wording: rank lists and where the ranks run (no MPI needed).
#include <gtest/gtest.h>

#include "gpt2p/core/roll_call.h"

namespace gpt2p {
namespace {

TEST(RollCallWords, RankListsCollapseRuns) {
  EXPECT_EQ(describe_ranks({}), "");
  EXPECT_EQ(describe_ranks({2}), "2");
  EXPECT_EQ(describe_ranks({2, 3}), "2-3");
  EXPECT_EQ(describe_ranks({0, 1, 4, 6, 7, 8}), "0-1, 4, 6-8");
}

TEST(RollCallWords, PlacementGroupsRanksByHostInRankOrder) {
  EXPECT_EQ(RollCall::describe_placement({"node1", "node1", "node2", "node2"}),
            "node1 (ranks 0-1), node2 (ranks 2-3)");
  EXPECT_EQ(RollCall::describe_placement({"a", "b", "a"}), "a (ranks 0, 2), b (rank 1)");
  EXPECT_EQ(RollCall::describe_placement({"solo"}), "solo (rank 0)");
}

}  // namespace
}  // namespace gpt2p
