// comm/gpu_placement.h on MPI ranks of one host, with stand-in GPU ids: which ranks share a GPU
// is decided by the ids the ranks report, not by how many GPUs each one sees.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <string>

#include "gpt2p/comm/gpu_placement.h"
#include "gpt2p/core/mpi_env.h"

namespace gpt2p::comm {
namespace {

constexpr std::chrono::milliseconds kTimeout{60000};

TEST(GpuPlacement, RanksOnOneGpuShareIt) {
  const Topology world = query_topology(MPI_COMM_WORLD);
  const auto p = place_on_gpus(
      world, 1, [](int) { return std::string("0000:1B:00.0"); }, kTimeout);
  EXPECT_EQ(p.gpu, 0);
  EXPECT_EQ(p.ranks_on_host, world.local_size);
  EXPECT_EQ(p.gpus_on_host, 1);
  EXPECT_EQ(p.host_shares, world.local_size > 1);
  EXPECT_EQ(p.job_shares, world.local_size > 1);
  EXPECT_TRUE(p.one_host);
  EXPECT_EQ(p.lowest_on_host, world.local_rank == 0);
  EXPECT_EQ(describe_sharing(p, "h"), std::to_string(world.local_size) + " ranks share 1 GPU on h");
}

TEST(GpuPlacement, AGpuPerRankIsNoSharing) {
  const Topology world = query_topology(MPI_COMM_WORLD);
  const auto p = place_on_gpus(
      world, world.local_size, [](int i) { return "0000:" + std::to_string(i) + ":00.0"; },
      kTimeout);
  EXPECT_EQ(p.gpu, world.local_rank);
  EXPECT_EQ(p.gpus_on_host, world.local_size);
  EXPECT_FALSE(p.host_shares);
  EXPECT_FALSE(p.job_shares);
}

// A launcher that gives every rank its own CUDA_VISIBLE_DEVICES: each sees one GPU (index 0), but
// the ids differ, so no rank shares.
TEST(GpuPlacement, OneVisibleGpuEachButDifferentGpusIsNoSharing) {
  const Topology world = query_topology(MPI_COMM_WORLD);
  const std::string mine = "0000:" + std::to_string(10 + world.local_rank) + ":00.0";
  const auto p = place_on_gpus(
      world, 1, [&](int) { return mine; }, kTimeout);
  EXPECT_EQ(p.gpu, 0);
  EXPECT_FALSE(p.host_shares);
  EXPECT_EQ(p.gpus_on_host, world.local_size);
}

TEST(GpuPlacement, SharingRanksGetNcclHostIdsOfTheirOwn) {
  const Topology world = query_topology(MPI_COMM_WORLD);
  if (world.local_size < 2) GTEST_SKIP() << "needs 2 ranks on the host";
  ::unsetenv("NCCL_SOCKET_IFNAME");
  ::unsetenv("NCCL_NET");
  const auto p = place_on_gpus(
      world, 1, [](int) { return std::string("gpu"); }, kTimeout);
  give_nccl_ranks_own_hosts(p, world.rank);
  const char* id = std::getenv("NCCL_HOSTID");
  ASSERT_NE(id, nullptr);
  const std::string suffix = "/rank" + std::to_string(world.rank);
  const std::string value = id;
  ASSERT_GE(value.size(), suffix.size());
  EXPECT_EQ(value.substr(value.size() - suffix.size()), suffix);
  EXPECT_STREQ(std::getenv("NCCL_SOCKET_IFNAME"), "lo");
  EXPECT_STREQ(std::getenv("NCCL_NET"), "Socket");
  // Once per process: a second call adds no second suffix.
  give_nccl_ranks_own_hosts(p, world.rank);
  EXPECT_EQ(std::string(std::getenv("NCCL_HOSTID")), value);
}

}  // namespace
}  // namespace gpt2p::comm
