// The NCCL backend at 2 and 4 ranks: the same operations as tests/mpi/test_comm.cpp on CUDA
// tensors, compared with the MPI backend's results on the same data. With a GPU per rank NCCL
// uses its intra-node transports; where the ranks share a GPU each rank is a host of its own to
// NCCL, connected over sockets (comm/gpu_placement.h): the inter-node code path.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <chrono>
#include <cstdlib>
#include <string>

#include "gpt2p/comm/communicator.h"
#include "gpt2p/comm/gpu_placement.h"
#include "gpt2p/compat/device.h"
#include "gpt2p/core/error.h"
#include "support/errors.h"

namespace gpt2p::comm {
namespace {

using gpt2p::testing::error_of;

using ::testing::HasSubstr;

const std::vector<torch::ScalarType> kDtypes = {torch::kFloat32, torch::kFloat64, torch::kInt32,
                                                torch::kInt64, torch::kBFloat16};

// Rank r's input on the CPU: (r + 1) * (1, 2, 3, ...), exact in every dtype.
torch::Tensor rank_values(int r, std::vector<int64_t> shape, torch::ScalarType dtype) {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  return (torch::arange(1, n + 1, torch::kFloat64) * (r + 1)).reshape(shape).to(dtype);
}

void expect_same(const torch::Tensor& got, const torch::Tensor& want) {
  const torch::Tensor g = got.cpu();
  ASSERT_EQ(g.scalar_type(), want.scalar_type());
  ASSERT_EQ(g.sizes(), want.sizes());
  if (torch::equal(g, want)) return;
  if (want.numel() <= 64) {
    ADD_FAILURE() << "got\n" << g << "\nwant\n" << want;
  } else {
    const auto d = (g.to(torch::kFloat64) - want.to(torch::kFloat64)).abs();
    ADD_FAILURE() << "differs at " << d.ne(0).sum().item<int64_t>() << " of " << want.numel()
                  << " elements, by up to " << d.max().item<double>();
  }
}

// The NCCL options as the trainers set them (train/context.cpp): the rank's GPU, and NCCL host ids
// of their own where ranks share one. Collective over the job.
CommOptions nccl_options(std::chrono::milliseconds timeout = std::chrono::milliseconds(60000)) {
  const Topology world = query_topology(MPI_COMM_WORLD);
  const GpuPlacement gpus = place_on_gpus(world, static_cast<int>(torch::cuda::device_count()),
                                          compat::gpu_bus_id, timeout);
  give_nccl_ranks_own_hosts(gpus, world.rank);
  CommOptions options;
  options.backend = Backend::kNccl;
  options.timeout = timeout;
  options.device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(gpus.gpu));
  return options;
}

class NcclTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (torch::cuda::device_count() < 1) GTEST_SKIP() << "needs a GPU";
    nccl = make_communicator(nccl_options());
    mpi = make_mpi_communicator();
    rank = nccl->rank();
    world = nccl->size();
  }
  torch::Tensor gpu(const torch::Tensor& t) const { return t.to(nccl->device()); }

  std::unique_ptr<Communicator> nccl;
  std::unique_ptr<Communicator> mpi;
  int rank = 0;
  int world = 1;
};

TEST_F(NcclTest, DeviceIsTheLocalRanksGpu) {
  EXPECT_EQ(nccl->backend_name(), "nccl");
  const int gpus = static_cast<int>(torch::cuda::device_count());
  EXPECT_EQ(nccl->device(), torch::Device(torch::kCUDA, nccl->local_rank() % gpus));
  if (nccl->topology().local_size > gpus) {
    // Each rank told NCCL it is a host of its own.
    const char* id = std::getenv("NCCL_HOSTID");
    ASSERT_NE(id, nullptr);
    EXPECT_THAT(std::string(id), ::testing::EndsWith("/rank" + std::to_string(nccl->rank())));
  }
}

TEST_F(NcclTest, AllReduceMatchesMpiEveryDtype) {
  for (auto dtype : kDtypes) {
    SCOPED_TRACE(dtype_name(dtype));
    torch::Tensor cpu = rank_values(rank, {3, 5}, dtype);
    torch::Tensor cuda = gpu(cpu);
    mpi->all_reduce(cpu);
    nccl->all_reduce(cuda);
    expect_same(cuda, cpu);
  }
  for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    torch::Tensor cpu = (torch::arange(8, torch::kFloat64) + rank).to(dtype);
    torch::Tensor cuda = gpu(cpu);
    mpi->all_reduce(cpu, ReduceOp::kAvg);
    nccl->all_reduce(cuda, ReduceOp::kAvg);
    expect_same(cuda, cpu);
  }
}

TEST_F(NcclTest, ListAllReduceInOneGroupWithNonContiguousViews) {
  torch::Tensor base = gpu(rank_values(rank, {3, 4}, torch::kBFloat16));
  std::vector<torch::Tensor> list{gpu(rank_values(rank, {5}, torch::kFloat32)), base.t(),
                                  gpu(torch::empty({0}))};
  std::vector<torch::Tensor> want{rank_values(rank, {5}, torch::kFloat32),
                                  rank_values(rank, {3, 4}, torch::kBFloat16)};
  nccl->all_reduce(list);
  mpi->all_reduce(want[0]);
  mpi->all_reduce(want[1]);
  expect_same(list[0], want[0]);
  expect_same(base, want[1]);
}

TEST_F(NcclTest, BroadcastAllGatherAndEmptyTensors) {
  for (auto dtype : kDtypes) {
    SCOPED_TRACE(dtype_name(dtype));
    torch::Tensor t = gpu(rank_values(rank, {2, 3}, dtype));
    nccl->broadcast(t, world - 1);
    expect_same(t, rank_values(world - 1, {2, 3}, dtype));
    torch::Tensor g = nccl->all_gather(gpu(rank_values(rank, {2, 3}, dtype)));
    expect_same(g, mpi->all_gather(rank_values(rank, {2, 3}, dtype)));
  }
  torch::Tensor empty = gpu(torch::empty({0}));
  nccl->all_reduce(empty);
  nccl->broadcast(empty, 0);
  EXPECT_EQ(nccl->all_gather(empty).sizes(), torch::IntArrayRef({world, 0}));
}

TEST_F(NcclTest, AllGatherAsyncFillsTheOutputLikeAllGather) {
  for (auto dtype : kDtypes) {
    SCOPED_TRACE(dtype_name(dtype));
    const torch::Tensor in = gpu(rank_values(rank, {4, 5}, dtype));
    torch::Tensor out = torch::empty({world, 4, 5}, in.options());
    auto work = nccl->all_gather_async(in, out);
    work->synchronize();
    expect_same(out, mpi->all_gather(rank_values(rank, {4, 5}, dtype)));
  }
  torch::Tensor wrong = gpu(torch::empty({world + 1, 2}));
  EXPECT_NE(error_of([&] {
              nccl->all_gather_async(gpu(torch::ones({2})), wrong);
            }).find("all_gather_async: output must be"),
            std::string::npos);
}

TEST_F(NcclTest, ReduceScatterMatchesMpiEveryDtype) {
  for (auto dtype : kDtypes) {
    SCOPED_TRACE(dtype_name(dtype));
    const auto host = rank_values(rank, {world * 3, 2}, dtype);
    torch::Tensor want = torch::empty({3, 2}, host.options());
    mpi->reduce_scatter(host, want);
    torch::Tensor got = gpu(torch::empty({3, 2}, host.options()));
    nccl->reduce_scatter(gpu(host), got);
    expect_same(got, want);
    if (!host.is_floating_point()) continue;
    torch::Tensor avg = gpu(torch::empty({6}, host.options()));
    nccl->reduce_scatter_async(gpu(host), avg, ReduceOp::kAvg)->synchronize();
    mpi->reduce_scatter(host, want, ReduceOp::kAvg);
    expect_same(avg, want.reshape({6}));
  }
}

TEST_F(NcclTest, SendRecvRing) {
  // NCCL send/recv outside a group block on the stream: rank 0 sends first, the others receive
  // first, so the ring cannot deadlock.
  if (world < 2) GTEST_SKIP() << "needs 2 ranks";
  const int next = (rank + 1) % world;
  const int prev = (rank + world - 1) % world;
  for (auto dtype : {torch::kFloat32, torch::kBFloat16, torch::kInt64}) {
    torch::Tensor out = gpu(rank_values(rank, {4, 3}, dtype));
    torch::Tensor base = gpu(torch::zeros({3, 4}, dtype));
    torch::Tensor in = base.t();  // non-contiguous receive
    if (rank == 0) {
      nccl->send(out, next);
      nccl->recv(in, prev);
    } else {
      nccl->recv(in, prev);
      nccl->send(out, next);
    }
    expect_same(base.t(), rank_values(prev, {4, 3}, dtype));
  }
}

TEST_F(NcclTest, BatchExchangesBothWaysWhereSeparateCallsWouldDeadlock) {
  // 1F1B's steady state: both ranks send first and receive second. Issued one by one on the
  // stream, each send would wait for a receive queued behind the peer's own send; in one batch
  // (one NCCL group) they complete. 64 MiB each, far above any eager-send buffering.
  if (world < 2) GTEST_SKIP() << "needs 2 ranks";
  const int peer = rank ^ 1;
  if (peer >= world) GTEST_SKIP() << "odd rank out";
  const int64_t n = 16 << 20;
  for (int round = 0; round < 3; ++round) {
    torch::Tensor out = gpu(torch::full({n}, static_cast<float>(rank * 10 + round)));
    torch::Tensor in = gpu(torch::zeros({n}));
    std::vector<P2POp> ops{{P2POp::Kind::kSend, out, peer}, {P2POp::Kind::kRecv, in, peer}};
    auto works = nccl->batch_isend_irecv(ops);
    ASSERT_EQ(works.size(), 2u);
    for (auto& w : works) w->synchronize();
    EXPECT_EQ(in.min().item<float>(), static_cast<float>(peer * 10 + round));
    EXPECT_EQ(in.max().item<float>(), static_cast<float>(peer * 10 + round));
  }
}

TEST_F(NcclTest, AsyncOverlapsComputeAndSynchronizeBlocks) {
  // Values whose sums stay exact in float32 at any rank count (each at most 4096 x the ranks'
  // (r + 1) sum), so NCCL's ring and MPI agree bit for bit whatever their order.
  const torch::Tensor host =
      ((torch::arange(1 << 22, torch::kFloat64).remainder(4096) + 1) * (rank + 1))
          .to(torch::kFloat32);
  torch::Tensor grads = gpu(host);
  WorkPtr work = nccl->all_reduce_async(grads);
  torch::Tensor a = torch::ones({1024, 1024}, torch::TensorOptions().device(nccl->device()));
  torch::Tensor c = torch::matmul(a, a);  // on the current stream, while NCCL runs on its own
  work->wait();                           // the current stream now waits for the all_reduce
  torch::Tensor want = host.clone();
  mpi->all_reduce(want);
  expect_same(grads, want);
  EXPECT_EQ(c[0][0].item<float>(), 1024.0F);

  torch::Tensor x = gpu(torch::full({1 << 20}, rank + 1.0, torch::kFloat32));
  WorkPtr w = nccl->all_reduce_async(x);
  w->synchronize();
  EXPECT_TRUE(w->is_completed());
  nccl->barrier();
  EXPECT_EQ(x[0].item<float>(), world * (world + 1) / 2.0F);
}

TEST_F(NcclTest, ErrorsNameDeviceDtypeAndPeer) {
  torch::Tensor cpu = torch::ones({2});
  EXPECT_THAT(error_of([&] { nccl->all_reduce(cpu); }),
              HasSubstr("all_reduce: tensor is on cpu but the nccl communicator works on cuda"));
  torch::Tensor i8 = gpu(torch::ones({2}, torch::kInt8));
  EXPECT_THAT(error_of([&] { nccl->all_reduce(i8); }), HasSubstr("unsupported dtype int8"));
  torch::Tensor f = gpu(torch::ones({2}));
  EXPECT_THAT(error_of([&] { nccl->send(f, world); }), HasSubstr("send: invalid peer rank"));
  if (world < 2) return;
  torch::Tensor odd = gpu(torch::ones({rank == 0 ? 2 : 3}));
  EXPECT_THAT(error_of([&] { nccl->all_reduce(odd); }),
              HasSubstr("ranks disagree on the number of elements"));
}

// Last: rank 0 starts an all_reduce nobody joins; synchronize() must give up after the timeout,
// abort the NCCL communicator and throw instead of hanging.
TEST(NcclTimeout, SynchronizeAbortsAfterTheTimeout) {
  if (torch::cuda::device_count() < 1) GTEST_SKIP() << "needs a GPU";
  auto comm = make_communicator(nccl_options(std::chrono::milliseconds(1000)));
  if (comm->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  if (comm->rank() == 0) {
    torch::Tensor t = torch::ones({16}, torch::TensorOptions().device(comm->device()));
    const std::string e = error_of([&] { comm->all_reduce_async(t)->synchronize(); });
    EXPECT_THAT(e, HasSubstr("did not complete within 1000 ms"));
    EXPECT_THAT(e, HasSubstr("aborted"));
  } else {
    (void)comm.release();  // its peer is aborted: do not try to tear it down cleanly
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace gpt2p::comm
