// dp_train's and pp_train's loops on CUDA, as a user with one GPU runs them (mpirun -np 2 on one
// GPU: --comm auto talks over NCCL, which connects ranks sharing a GPU over sockets; with a GPU
// per rank, over its intra-node transports). Every rank's losses equal the same run's on CPU ranks
// over MPI (no TF32: fp32 sums on both), for data parallelism and every pipeline schedule,
// zero-bubble and interleaved included. That proves the GPU paths (NCCL, streams, events, fused
// AdamW) with the ranks that one GPU can hold. test_nccl_agreement_gpu compares NCCL with MPI on
// the GPU, mode by mode.
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <cmath>

#include "gpt2p/parallel/trainers/dp_trainer.h"
#include "gpt2p/parallel/trainers/pp_trainer.h"
#include "support/h5_read.h"
#include "support/trainer_fixture.h"

namespace gpt2p::parallel {
namespace {

using gpt2p::testing::read_column;

class TrainersOnGpu : public gpt2p::testing::TrainerTest {
 protected:
  void SetUp() override {
    if (torch::cuda::device_count() < 1) GTEST_SKIP() << "needs a GPU";
    TrainerTest::SetUp();
  }
  // The same run's losses on cuda and on cpu, within rel_tol, step by step on this rank.
  void expect_cuda_equals_cpu(const std::string& name, size_t steps, double rel_tol) const {
    const auto gpu = read_column(rank_file(name + "-cuda"), "/steps/loss");
    const auto cpu = read_column(rank_file(name + "-cpu"), "/steps/loss");
    ASSERT_EQ(gpu.size(), steps);
    ASSERT_EQ(cpu.size(), steps);
    for (size_t i = 0; i < steps; ++i) EXPECT_NEAR(gpu[i], cpu[i], rel_tol * cpu[i]) << i;
  }
  parallel::TrainConfig on(parallel::TrainConfig c, const std::string& device) const {
    c.output.out += "-" + device;
    c.compute.device = *from_name<DeviceKind>(device);
    c.compute.precision = gpt2p::model::Precision::kFp32;
    c.output.save_every = -1;
    return c;
  }
};

TEST_F(TrainersOnGpu, DataParallelLossesEqualTheCpuRun) {
  for (const char* sync : {"bucketed", "per-param"}) {
    auto c = config(std::string("dp-") + sync, 3);
    c.data_parallel.grad_sync = *from_name<GradSyncMode>(sync);
    c.data_parallel.bucket_mb = 0.05;
    for (const char* device : {"cuda", "cpu"}) {
      ASSERT_EQ(train_data_parallel(on(c, device), parallel::Program::kDataParallel, topo), 0);
    }
    expect_cuda_equals_cpu(std::string("dp-") + sync, 3, 1e-4);
  }
}

TEST_F(TrainersOnGpu, EveryPipelineScheduleEqualsTheCpuRun) {
  const int n = comm->size();
  struct Case {
    const char* name;
    const char* schedule;
    int microbatches;
    bool zero_bubble;
  };
  const Case cases[] = {{"gpipe", "gpipe", 4, false},
                        {"1f1b", "1f1b", 4, false},
                        {"1f1b-zb", "1f1b", 4, true},
                        {"interleaved", "interleaved", 2 * n, false},
                        {"interleaved-zb", "interleaved", 2 * n, true}};
  for (const auto& k : cases) {
    if (12 % k.microbatches != 0) continue;
    SCOPED_TRACE(k.name);
    auto c = config(std::string("pp-") + k.name, 3, /*blocks=*/8);
    c.pipeline.mode = gpt2p::parallel::PipelineMode::kPipeline;
    c.pipeline.schedule = *from_name<pipeline::ScheduleKind>(k.schedule);
    c.pipeline.microbatches = k.microbatches;
    c.pipeline.zero_bubble = k.zero_bubble;
    c.pipeline.stages_per_rank = std::string(k.schedule) == "interleaved" ? 2 : 1;
    for (const char* device : {"cuda", "cpu"}) ASSERT_EQ(train_pipeline(on(c, device), topo), 0);
    expect_cuda_equals_cpu(std::string("pp-") + k.name, 3, 1e-4);
  }
}

// pp_train --dp 2: two replicas of an n/2-rank pipeline (2 x 2 on 4 ranks, 2 x 1 on 2) sharing
// the GPU over NCCL train as the same hybrid does on the CPU (whose equality with one rank on the
// whole batch tests/mpi/test_hybrid.cpp checks).
TEST_F(TrainersOnGpu, HybridLossesEqualTheCpuRun) {
  auto c = config("hybrid", 3, /*blocks=*/8);
  c.pipeline.mode = gpt2p::parallel::PipelineMode::kPipeline;
  c.pipeline.schedule = pipeline::ScheduleKind::kOneFOneB;
  c.pipeline.microbatches = 2;  // of a replica's 6 rows
  c.pipeline.dp = 2;
  for (const char* device : {"cuda", "cpu"}) ASSERT_EQ(train_pipeline(on(c, device), topo), 0);
  expect_cuda_equals_cpu("hybrid", 3, 1e-4);
}

// --zero 1 on ranks sharing the GPU: the sharded AdamW (reduce-scatter, fused AdamW on the
// shards, all-gather, over NCCL) trains as on CPU ranks, where tests/mpi/test_zero.cpp
// checks it against the unsharded step and one rank on the whole batch. Data parallel, and the
// hybrid's replicas (2 x 1 on 2 ranks, 2 x 2 on 4).
TEST_F(TrainersOnGpu, ZeroLossesEqualTheCpuRun) {
  auto dp = config("zero-dp", 3);
  dp.data_parallel.bucket_mb = 0.05;
  dp.data_parallel.zero = 1;
  for (const char* device : {"cuda", "cpu"}) {
    ASSERT_EQ(train_data_parallel(on(dp, device), parallel::Program::kDataParallel, topo), 0);
  }
  expect_cuda_equals_cpu("zero-dp", 3, 1e-4);
  auto hybrid = config("zero-hybrid", 3, /*blocks=*/8);
  hybrid.pipeline.microbatches = 2;
  hybrid.pipeline.dp = 2;
  hybrid.data_parallel.zero = 1;
  for (const char* device : {"cuda", "cpu"}) ASSERT_EQ(train_pipeline(on(hybrid, device), topo), 0);
  expect_cuda_equals_cpu("zero-hybrid", 3, 1e-4);
}

}  // namespace
}  // namespace gpt2p::parallel
