// The job's grid with named dimensions (parallel/train/mesh.h): coordinates, groups and the
// validation every program runs once, with its messages.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpt2p/cli/options.h"
#include "gpt2p/parallel/train/mesh.h"

namespace gpt2p {
namespace {

using parallel::Mesh;
using parallel::MeshDim;
using ::testing::HasSubstr;

template <class F>
std::string usage(F f) {
  try {
    f();
  } catch (const cli::UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(Mesh, DpPpPutsAPipelinesRanksNextToEachOther) {
  // 6 ranks as 2 replicas of a 3-rank pipeline: world rank r is pipeline rank r % 3 of replica r
  // / 3.
  for (int r = 0; r < 6; ++r) {
    const auto m = Mesh::build("dp-pp", {2, 3}, 6, r);
    EXPECT_EQ(m.dp(), 2);
    EXPECT_EQ(m.pp(), 3);
    EXPECT_EQ(m.dp_rank(), r / 3);
    EXPECT_EQ(m.pp_rank(), r % 3);
    EXPECT_EQ(m.world_rank(), r);
    EXPECT_EQ(m.innermost(), MeshDim::kPp);
    // Along pp: this replica's pipeline; along dp: this pipeline rank in every replica.
    EXPECT_EQ(m.world_rank_along(MeshDim::kPp, 0), (r / 3) * 3);
    EXPECT_EQ(m.world_rank_along(MeshDim::kDp, 1), 3 + r % 3);
    EXPECT_EQ(m.group_along(MeshDim::kPp), r / 3);
    EXPECT_EQ(m.group_along(MeshDim::kDp), r % 3);
  }
  EXPECT_EQ(Mesh::build("dp-pp", {2, 3}, 6, 0).describe(), "dp=2 x pp=3");
}

TEST(Mesh, TheOrderStringPicksWhichDimensionIsInnermost) {
  // "pp-dp": a stage's replicas are consecutive instead.
  const auto m = Mesh::build("pp-dp", {3, 2}, 6, 4);
  EXPECT_EQ(m.pp_rank(), 2);
  EXPECT_EQ(m.dp_rank(), 0);
  EXPECT_EQ(m.innermost(), MeshDim::kDp);
  EXPECT_EQ(m.world_rank_along(MeshDim::kDp, 1), 5);
  EXPECT_EQ(m.world_rank_along(MeshDim::kPp, 0), 0);
}

TEST(Mesh, GroupsAlongADimensionPartitionTheWorld) {
  // Every group along d has size(d) ranks, holding each coordinate once.
  for (const auto& [order, sizes] : std::vector<std::pair<std::string, std::vector<int>>>{
           {"dp-pp", {2, 4}}, {"pp-dp", {4, 2}}, {"dp", {8}}, {"dp-pp", {8, 1}}}) {
    for (const MeshDim d : {MeshDim::kDp, MeshDim::kPp}) {
      std::vector<std::set<int>> groups(8);
      for (int r = 0; r < 8; ++r) {
        const auto m = Mesh::build(order, sizes, 8, r);
        ASSERT_LT(m.group_along(d), 8 / m.size(d));
        EXPECT_TRUE(groups[m.group_along(d)].insert(m.rank(d)).second) << order << " rank " << r;
        EXPECT_EQ(Mesh::build(order, sizes, 8, m.world_rank_along(d, m.rank(d))).world_rank(), r);
      }
      const int size = Mesh::build(order, sizes, 8, 0).size(d);
      for (int g = 0; g < 8 / size; ++g) EXPECT_EQ(static_cast<int>(groups[g].size()), size);
    }
  }
}

TEST(Mesh, AMissingDimensionHasSizeOne) {
  const auto m = Mesh::build("dp", {4}, 4, 3);
  EXPECT_EQ(m.pp(), 1);
  EXPECT_EQ(m.pp_rank(), 0);
  EXPECT_EQ(m.group_along(MeshDim::kPp), 3);
  EXPECT_EQ(m.group_along(MeshDim::kDp), 0);
  EXPECT_EQ(Mesh().describe(), "dp=1");
}

TEST(Mesh, BadOrdersAndSizesAreRefused) {
  const auto what = [](auto f) -> std::string {
    try {
      f();
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_THAT(what([] {
                Mesh::build("dp-tp", {2, 2}, 4, 0);
              }),
              HasSubstr("unknown dimension \"tp\""));
  EXPECT_THAT(what([] { Mesh::build("dp-dp", {2, 2}, 4, 0); }), HasSubstr("named twice"));
  EXPECT_THAT(what([] { Mesh::build("dp-pp", {2}, 2, 0); }), HasSubstr("2 dimensions but 1 sizes"));
  EXPECT_THAT(what([] { Mesh::build("dp-pp", {2, 3}, 4, 0); }), HasSubstr("multiply to 6"));
  EXPECT_THAT(what([] { Mesh::build("dp", {0}, 0, 0); }), HasSubstr("below 1"));
}

TEST(Mesh, TheJobsMeshIsValidatedWithTheFix) {
  EXPECT_THAT(usage([] { parallel::make_pipeline_mesh(4, 0, 3); }),
              HasSubstr("--dp 3 does not divide the 4 ranks"));
  EXPECT_THAT(usage([] { parallel::make_pipeline_mesh(4, 0, 0); }), HasSubstr("--dp 0"));
  EXPECT_THAT(usage([] { parallel::make_job_mesh("pp_train", 4, 0, 2, 12, 4, 0); }),
              HasSubstr("--microbatches 4 does not divide a replica's batch of 6"));
  EXPECT_THAT(usage([] { parallel::make_job_mesh("pp_train", 6, 0, 3, 16, 1, 0); }),
              HasSubstr("--batch-size 16 does not split over --dp 3"));
  EXPECT_THAT(usage([] { parallel::make_job_mesh("pp_train", 4, 0, 1, 16, 1, 1); }),
              HasSubstr("pp_train --zero 1 shards each stage's optimizer state"));
  EXPECT_THAT(usage([] { parallel::make_job_mesh("dp_train", 3, 0, 1, 16, 1, 0); }),
              HasSubstr("--batch-size 16 (global) does not divide over 3 ranks -- fix:"));
  EXPECT_THAT(usage([] { parallel::make_job_mesh("dp_train", 1, 0, 1, 16, 1, 1); }),
              HasSubstr("dp_train --zero 1 shards the optimizer state"));
  EXPECT_THAT(usage([] { parallel::make_job_mesh("gpt2_train", 2, 0, 1, 16, 1, 0); }),
              HasSubstr("gpt2_train is the single-rank trainer but runs on 2 ranks"));
  const auto hybrid = parallel::make_job_mesh("pp_train", 6, 5, 2, 12, 2, 1);
  EXPECT_EQ(hybrid.describe(), "dp=2 x pp=3");
  EXPECT_EQ(hybrid.dp_rank(), 1);
  EXPECT_EQ(hybrid.pp_rank(), 2);
  const auto dp = parallel::make_job_mesh("dp_train", 4, 2, 1, 16, 1, 1);
  EXPECT_EQ(dp.describe(), "dp=4");
  EXPECT_EQ(dp.innermost(), MeshDim::kDp);
}

}  // namespace
}  // namespace gpt2p
