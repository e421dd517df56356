// The MPI backend of the Communicator, at 2, 3 and 4 ranks: every operation and dtype against a
// result computed locally, edge sizes, chunking, async overlap and the error paths.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "gpt2p/comm/mpi_communicator.h"
#include "gpt2p/core/error.h"
#include "support/errors.h"

namespace gpt2p::comm {
namespace {

using gpt2p::testing::error_of;

using ::testing::HasSubstr;

const std::vector<torch::ScalarType> kDtypes = {torch::kFloat32, torch::kFloat64, torch::kInt32,
                                                torch::kInt64, torch::kBFloat16};

// The message of the gpt2p::Error that f throws ("" when it throws none).
// Rank r's input: (r + 1) * (1, 2, 3, ...) in `dtype`. Small integers: exact in bfloat16 too.
torch::Tensor rank_values(int r, std::vector<int64_t> shape, torch::ScalarType dtype) {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  return (torch::arange(1, n + 1, torch::kFloat64) * (r + 1)).reshape(shape).to(dtype);
}

// The sum of rank_values over all ranks, computed here.
torch::Tensor expected_sum(int world, std::vector<int64_t> shape, torch::ScalarType dtype) {
  torch::Tensor sum = torch::zeros(shape, torch::kFloat64);
  for (int r = 0; r < world; ++r) sum += rank_values(r, shape, torch::kFloat64);
  return sum.to(dtype);
}

void expect_same(const torch::Tensor& got, const torch::Tensor& want) {
  ASSERT_EQ(got.scalar_type(), want.scalar_type());
  ASSERT_EQ(got.sizes(), want.sizes());
  EXPECT_TRUE(torch::equal(got, want)) << "got\n" << got << "\nwant\n" << want;
}

class CommTest : public ::testing::Test {
 protected:
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  int rank = comm->rank();
  int world = comm->size();
};

TEST_F(CommTest, TopologyAndDuplicatedCommunicator) {
  int r = -1;
  int n = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  EXPECT_EQ(comm->rank(), r);
  EXPECT_EQ(comm->size(), n);
  EXPECT_EQ(comm->backend(), Backend::kMpi);
  EXPECT_EQ(comm->device(), torch::Device(torch::kCPU));
  auto* mpi = dynamic_cast<MpiCommunicator*>(comm.get());
  ASSERT_NE(mpi, nullptr);
  int cmp = 0;
  MPI_Comm_compare(mpi->mpi_comm(), MPI_COMM_WORLD, &cmp);
  EXPECT_EQ(cmp, MPI_CONGRUENT);  // same group, different context: a dup
}

TEST_F(CommTest, AllReduceSumEveryDtype) {
  for (auto dtype : kDtypes) {
    SCOPED_TRACE(dtype_name(dtype));
    torch::Tensor t = rank_values(rank, {3, 5}, dtype);
    comm->all_reduce(t);
    expect_same(t, expected_sum(world, {3, 5}, dtype));
  }
}

TEST_F(CommTest, AllReduceAvgFloatingDtypes) {
  for (auto dtype : {torch::kFloat32, torch::kFloat64, torch::kBFloat16}) {
    SCOPED_TRACE(dtype_name(dtype));
    // rank + (0..7): the average (world-1)/2 + i is a multiple of 0.5, exact in every dtype.
    torch::Tensor t = (torch::arange(8, torch::kFloat64) + rank).to(dtype);
    comm->all_reduce(t, ReduceOp::kAvg);
    expect_same(t, (torch::arange(8, torch::kFloat64) + (world - 1) / 2.0).to(dtype));
  }
}

TEST_F(CommTest, AllReduceNonContiguousWritesBackThroughTheView) {
  torch::Tensor base = rank_values(rank, {4, 6}, torch::kFloat32);
  torch::Tensor view = base.t();  // [6, 4], not contiguous
  ASSERT_FALSE(view.is_contiguous());
  comm->all_reduce(view);
  expect_same(base, expected_sum(world, {4, 6}, torch::kFloat32));
}

TEST_F(CommTest, EmptyAndOneElementTensors) {
  torch::Tensor empty = torch::empty({0}, torch::kFloat32);
  comm->all_reduce(empty);
  EXPECT_EQ(empty.numel(), 0);
  comm->broadcast(empty, 0);
  EXPECT_EQ(comm->all_gather(empty).sizes(), torch::IntArrayRef({world, 0}));
  comm->all_reduce_async(empty)->wait();

  torch::Tensor one = torch::full({1}, rank + 1.0, torch::kFloat64);
  comm->all_reduce(one);
  EXPECT_EQ(one.item<double>(), world * (world + 1) / 2.0);
  torch::Tensor scalar = torch::tensor(int64_t{rank});
  comm->broadcast(scalar, world - 1);
  EXPECT_EQ(scalar.item<int64_t>(), world - 1);
  expect_same(comm->all_gather(torch::tensor(int64_t{rank})), torch::arange(world, torch::kInt64));

  const int next = (rank + 1) % world;
  const int prev = (rank + world - 1) % world;
  torch::Tensor in = torch::full({1}, -1.0, torch::kFloat32);
  auto r = comm->recv_async(in, prev);
  auto s = comm->send_async(torch::full({1}, static_cast<double>(rank), torch::kFloat32), next);
  s->wait();
  r->wait();
  EXPECT_EQ(in.item<float>(), static_cast<float>(prev));
  torch::Tensor in0 = torch::empty({0}, torch::kInt64);
  auto r0 = comm->recv_async(in0, prev);
  comm->send(torch::empty({0}, torch::kInt64), next);
  r0->wait();
}

TEST_F(CommTest, LargeBufferOf64MB) {
  const int64_t n = int64_t{16} << 20;  // 16 Mi float32 = 64 MiB
  torch::Tensor t = torch::full({n}, rank + 1.0, torch::kFloat32);
  t[n - 1] = -(rank + 1.0);
  comm->all_reduce(t);
  const float sum = world * (world + 1) / 2.0F;
  EXPECT_TRUE(torch::all(t.slice(0, 0, n - 1) == sum).item<bool>());
  EXPECT_EQ(t[n - 1].item<float>(), -sum);
}

TEST(CommChunks, EveryOperationInManyChunks) {
  MpiOptions options;
  options.max_chunk_elements = 1000;
  MpiCommunicator comm(MPI_COMM_WORLD, options);
  const int rank = comm.rank();
  const int world = comm.size();
  const std::vector<int64_t> shape{10007};
  for (auto dtype : {torch::kFloat32, torch::kBFloat16, torch::kInt64}) {
    SCOPED_TRACE(dtype_name(dtype));
    // Values stay small: (r+1) * (i % 100 + 1), so bfloat16 is exact.
    auto values = [&](int r) {
      return ((torch::arange(shape[0], torch::kFloat64).remainder(100) + 1) * (r + 1)).to(dtype);
    };
    torch::Tensor want = torch::zeros(shape, torch::kFloat64);
    for (int r = 0; r < world; ++r) want += values(r).to(torch::kFloat64);

    torch::Tensor t = values(rank);
    comm.all_reduce(t);
    expect_same(t, want.to(dtype));
    torch::Tensor a = values(rank);
    comm.all_reduce_async(a)->wait();
    expect_same(a, want.to(dtype));

    torch::Tensor b = values(rank);
    comm.broadcast(b, world - 1);
    expect_same(b, values(world - 1));

    torch::Tensor g = comm.all_gather(values(rank));
    for (int r = 0; r < world; ++r) expect_same(g[r], values(r));
    torch::Tensor ga = torch::empty({world, shape[0]}, values(rank).options());
    auto gw = comm.all_gather_async(values(rank), ga);
    gw->wait();
    for (int r = 0; r < world; ++r) expect_same(ga[r], values(r));

    // Each rank's part spans several chunks: rows of world x 10007 elements.
    torch::Tensor rows = values(rank).repeat({world});
    torch::Tensor part = torch::empty(shape, dtype);
    comm.reduce_scatter(rows, part);
    expect_same(part, want.to(dtype));

    torch::Tensor in = torch::zeros(shape, dtype);
    auto recv = comm.recv_async(in, (rank + world - 1) % world, 7);
    comm.send(values(rank), (rank + 1) % world, 7);
    recv->wait();
    expect_same(in, values((rank + world - 1) % world));
  }
}

TEST_F(CommTest, ListAllReduceFlattensAndCopiesBack) {
  torch::Tensor base = rank_values(rank, {3, 4}, torch::kFloat32);
  std::vector<torch::Tensor> list{rank_values(rank, {2, 3}, torch::kFloat32),
                                  rank_values(rank, {7}, torch::kFloat32), base.t(),
                                  torch::empty({0}, torch::kFloat32)};
  comm->all_reduce(list);
  expect_same(list[0], expected_sum(world, {2, 3}, torch::kFloat32));
  expect_same(list[1], expected_sum(world, {7}, torch::kFloat32));
  expect_same(base, expected_sum(world, {3, 4}, torch::kFloat32));

  std::vector<torch::Tensor> bf{rank_values(rank, {5}, torch::kBFloat16),
                                rank_values(rank, {2, 2}, torch::kBFloat16)};
  comm->all_reduce(bf, ReduceOp::kSum);
  expect_same(bf[0], expected_sum(world, {5}, torch::kBFloat16));
  expect_same(bf[1], expected_sum(world, {2, 2}, torch::kBFloat16));

  std::vector<torch::Tensor> mixed{torch::ones({2}), torch::ones({2}, torch::kInt64)};
  EXPECT_THAT(error_of([&] { comm->all_reduce(mixed); }),
              HasSubstr("all_reduce(list): tensor 1 is int64 but tensor 0 is float32"));
}

TEST_F(CommTest, BroadcastFromEveryRootEveryDtype) {
  for (int root = 0; root < world; ++root) {
    for (auto dtype : kDtypes) {
      SCOPED_TRACE(dtype_name(dtype) + " root " + std::to_string(root));
      torch::Tensor t = rank_values(rank, {2, 3}, dtype);
      comm->broadcast(t, root);
      expect_same(t, rank_values(root, {2, 3}, dtype));
    }
  }
  torch::Tensor base = rank_values(rank, {3, 2}, torch::kFloat32);
  torch::Tensor view = base.t();
  comm->broadcast(view, 0);
  expect_same(base, rank_values(0, {3, 2}, torch::kFloat32));
}

TEST_F(CommTest, AllGatherStacksInRankOrder) {
  for (auto dtype : kDtypes) {
    SCOPED_TRACE(dtype_name(dtype));
    torch::Tensor out = comm->all_gather(rank_values(rank, {2, 3}, dtype).t());
    ASSERT_EQ(out.sizes(), torch::IntArrayRef({world, 3, 2}));
    for (int r = 0; r < world; ++r) expect_same(out[r], rank_values(r, {2, 3}, dtype).t());
  }
}

TEST_F(CommTest, AllGatherAsyncWritesTheCallersOutput) {
  for (auto dtype : kDtypes) {
    SCOPED_TRACE(dtype_name(dtype));
    const auto in = rank_values(rank, {2, 3}, dtype).t();  // non-contiguous input
    torch::Tensor out = torch::empty({world, 3, 2}, in.options());
    auto work = comm->all_gather_async(in, out);
    work->wait();
    for (int r = 0; r < world; ++r) expect_same(out[r], rank_values(r, {2, 3}, dtype).t());
  }
  torch::Tensor wrong = torch::empty({world, 5});
  const auto msg = error_of([&] { comm->all_gather_async(torch::ones({4}), wrong); });
  EXPECT_NE(msg.find("all_gather_async: output must be a contiguous float32 tensor of shape"),
            std::string::npos)
      << msg;
}

TEST_F(CommTest, SendRecvRingEveryDtype) {
  const int next = (rank + 1) % world;
  const int prev = (rank + world - 1) % world;
  for (auto dtype : kDtypes) {
    SCOPED_TRACE(dtype_name(dtype));
    torch::Tensor in = torch::zeros({4, 3}, dtype);
    auto r = comm->recv_async(in, prev, 3);
    auto s = comm->send_async(rank_values(rank, {4, 3}, dtype), next, 3);
    r->wait();
    s->wait();
    EXPECT_TRUE(r->is_completed());
    expect_same(in, rank_values(prev, {4, 3}, dtype));
  }
  // Into a non-contiguous view.
  torch::Tensor base = torch::zeros({3, 4}, torch::kFloat64);
  torch::Tensor view = base.t();
  auto r = comm->recv_async(view, prev);
  comm->send(rank_values(rank, {4, 3}, torch::kFloat64), next);
  r->wait();
  expect_same(base.t(), rank_values(prev, {4, 3}, torch::kFloat64));
}

TEST_F(CommTest, BatchSendsAndReceivesBothWaysAtOnce) {
  // Every rank sends to both neighbours and receives from both in one batch, the pattern of a
  // middle pipeline stage; one Work per op, in order.
  const int next = (rank + 1) % world;
  const int prev = (rank + world - 1) % world;
  torch::Tensor from_prev = torch::zeros({5}, torch::kFloat32);
  torch::Tensor base = torch::zeros({3, 2}, torch::kFloat32);
  torch::Tensor from_next = base.t();  // non-contiguous: copied back when waited for
  std::vector<P2POp> ops{{P2POp::Kind::kSend, rank_values(rank, {5}, torch::kFloat32), next},
                         {P2POp::Kind::kRecv, from_prev, prev},
                         {P2POp::Kind::kSend, rank_values(rank, {2, 3}, torch::kFloat32), prev},
                         {P2POp::Kind::kRecv, from_next, next}};
  auto works = comm->batch_isend_irecv(ops);
  ASSERT_EQ(works.size(), ops.size());
  for (auto& w : works) w->wait();
  expect_same(from_prev, rank_values(prev, {5}, torch::kFloat32));
  expect_same(base.t(), rank_values(next, {2, 3}, torch::kFloat32));
}

TEST_F(CommTest, PingPongBetweenRanksZeroAndOne) {
  // The ball is incremented at each hop; ranks other than 0 and 1 only watch.
  torch::Tensor ball = torch::zeros({16}, torch::kInt64);
  const int rounds = 10;
  for (int i = 0; i < rounds; ++i) {
    if (rank == 0) {
      comm->send(ball, 1, i);
      comm->recv(ball, 1, i);
      ball += 1;
    } else if (rank == 1) {
      comm->recv(ball, 0, i);
      ball += 1;
      comm->send(ball, 0, i);
    }
  }
  if (rank == 0) {
    EXPECT_TRUE(torch::all(ball == 2 * rounds).item<bool>());
  }
  comm->barrier();
}

TEST_F(CommTest, AsyncOperationsOverlapCompute) {
  torch::Tensor grads = rank_values(rank, {1 << 20}, torch::kFloat32);
  torch::Tensor bf = rank_values(rank, {64}, torch::kBFloat16);
  WorkPtr work = comm->all_reduce_async(grads);
  WorkPtr work_bf = comm->all_reduce_async(bf, ReduceOp::kSum);
  const int next = (rank + 1) % world;
  const int prev = (rank + world - 1) % world;
  torch::Tensor in = torch::zeros({32}, torch::kFloat64);
  WorkPtr recv = comm->recv_async(in, prev, 11);
  WorkPtr send = comm->send_async(torch::full({32}, rank * 1.0, torch::kFloat64), next, 11);

  torch::Tensor a = torch::ones({128, 128});
  torch::Tensor c = torch::matmul(a, a);  // compute while the operations are in flight
  work->wait();
  work_bf->wait();
  recv->wait();
  send->wait();
  EXPECT_TRUE(work->is_completed());
  EXPECT_EQ(c[0][0].item<float>(), 128.0F);
  expect_same(grads, expected_sum(world, {1 << 20}, torch::kFloat32));
  expect_same(bf, expected_sum(world, {64}, torch::kBFloat16));
  expect_same(in, torch::full({32}, prev * 1.0, torch::kFloat64));

  torch::Tensor avg = torch::full({4}, rank * 2.0, torch::kFloat32);
  WorkPtr w = comm->all_reduce_async(avg, ReduceOp::kAvg);
  while (!w->is_completed()) {
  }
  EXPECT_TRUE(torch::all(avg == static_cast<float>(world - 1)).item<bool>());
}

TEST_F(CommTest, BarrierWaitsForTheSlowestRank) {
  const auto start = std::chrono::steady_clock::now();
  if (rank == 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  comm->barrier();
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_GE(waited, std::chrono::milliseconds(150));
}

TEST_F(CommTest, ReduceScatterLeavesEachRankItsPartOfTheSum) {
  for (auto dtype : kDtypes) {
    SCOPED_TRACE(dtype_name(dtype));
    // world x (2, 3): rank r's part is row r of the sum, whatever the input's shape.
    const auto in = rank_values(rank, {world * 2, 3}, dtype);
    const auto sum = expected_sum(world, {world * 2, 3}, dtype).reshape({world, 6});
    torch::Tensor out = torch::full({2, 3}, -1, in.options());
    comm->reduce_scatter(in, out);
    expect_same(out, sum[rank].reshape({2, 3}));
    torch::Tensor flat = torch::empty({6}, in.options());
    auto work = comm->reduce_scatter_async(in, flat);
    work->wait();
    expect_same(flat, sum[rank]);
  }
  // avg: the sum over the ranks, divided by them.
  const auto in = rank_values(rank, {world * 4}, torch::kFloat64);
  torch::Tensor avg = torch::empty({4}, torch::kFloat64);
  comm->reduce_scatter(in, avg, ReduceOp::kAvg);
  EXPECT_TRUE(torch::allclose(
      avg, expected_sum(world, {world * 4}, torch::kFloat64).narrow(0, rank * 4, 4) / world));
  // Nothing to reduce is no error.
  torch::Tensor empty_part = torch::empty({0});
  comm->reduce_scatter(torch::empty({0}), empty_part);

  torch::Tensor wrong = torch::empty({5});
  EXPECT_THAT(
      error_of([&] { comm->reduce_scatter(torch::ones({world * 4}), wrong); }),
      HasSubstr("reduce_scatter: output must be a contiguous float32 tensor of 4 elements"));
  torch::Tensor both = torch::ones({world * 4});
  torch::Tensor inside = both.narrow(0, 0, 4);
  EXPECT_THAT(error_of([&] { comm->reduce_scatter(both, inside); }),
              HasSubstr("reduce_scatter: output overlaps input"));
  torch::Tensor ints = torch::empty({1}, torch::kInt64);
  EXPECT_THAT(error_of([&] {
                comm->reduce_scatter(torch::ones({world}, torch::kInt64), ints, ReduceOp::kAvg);
              }),
              HasSubstr("avg of int64 tensors is not supported"));
}

TEST_F(CommTest, MismatchedSizesFailOnEveryRank) {
  torch::Tensor t = torch::ones({rank == 0 ? 4 : 5});
  const std::string e = error_of([&] { comm->all_reduce(t); });
  EXPECT_THAT(e,
              HasSubstr("all_reduce: ranks disagree on the number of elements: between 4 and 5"));
  EXPECT_THAT(e, HasSubstr("fix: every rank must make the same collective calls"));
  EXPECT_THAT(error_of([&] { comm->broadcast(t, 0); }),
              HasSubstr("broadcast: ranks disagree on the number of elements"));
  EXPECT_THAT(error_of([&] { comm->all_gather(t); }),
              HasSubstr("all_gather: ranks disagree on the number of elements"));
  torch::Tensor rs_in = torch::ones({rank == 0 ? world : 2 * world});
  torch::Tensor rs_out = torch::empty({rank == 0 ? 1 : 2});
  EXPECT_THAT(error_of([&] { comm->reduce_scatter(rs_in, rs_out); }),
              HasSubstr("reduce_scatter: ranks disagree on the number of elements"));
  std::vector<torch::Tensor> list{torch::ones({3}), torch::ones({rank == 0 ? 1 : 2})};
  EXPECT_THAT(error_of([&] { comm->all_reduce(list); }),
              HasSubstr("ranks disagree on the number of elements: between 4 and 5"));

  torch::Tensor d = torch::ones({4}, rank == 0 ? torch::kFloat32 : torch::kFloat64);
  EXPECT_THAT(error_of([&] { comm->all_reduce(d); }),
              HasSubstr("ranks disagree on the dtype: float32 and float64"));
  torch::Tensor f = torch::ones({4});
  EXPECT_THAT(error_of([&] { comm->all_reduce(f, rank == 0 ? ReduceOp::kSum : ReduceOp::kAvg); }),
              HasSubstr("ranks disagree on the reduce op"));
  EXPECT_THAT(error_of([&] { comm->broadcast(f, rank == 0 ? 0 : 1); }),
              HasSubstr("ranks disagree on the root"));
  // After the errors the communicator still works.
  comm->all_reduce(f);
  EXPECT_TRUE(torch::all(f == world).item<bool>());
}

TEST_F(CommTest, InvalidPeersRootsAndTags) {
  torch::Tensor t = torch::ones({2});
  EXPECT_THAT(error_of([&] { comm->send(t, world); }),
              HasSubstr("send: invalid peer rank " + std::to_string(world) + " (communicator has " +
                        std::to_string(world) + " ranks"));
  EXPECT_THAT(error_of([&] { comm->recv_async(t, -1); }), HasSubstr("recv: invalid peer rank -1"));
  EXPECT_THAT(error_of([&] { comm->send_async(t, rank); }),
              HasSubstr("send: peer rank " + std::to_string(rank) + " is this rank itself"));
  EXPECT_THAT(error_of([&] { comm->send(t, (rank + 1) % world, -5); }),
              HasSubstr("send: invalid tag -5"));
  EXPECT_THAT(error_of([&] { comm->broadcast(t, world); }),
              HasSubstr("broadcast: invalid root rank " + std::to_string(world)));
}

TEST_F(CommTest, UnsupportedDtypesNameTheSupportedOnes) {
  for (auto dtype : {torch::kInt8, torch::kBool, torch::kFloat16}) {
    torch::Tensor t = torch::zeros({3}, dtype);
    const std::string e = error_of([&] { comm->all_reduce(t); });
    EXPECT_THAT(e, HasSubstr("all_reduce: unsupported dtype " + dtype_name(dtype)));
    EXPECT_THAT(e, HasSubstr("float32, float64, int32, int64, bfloat16"));
    EXPECT_THAT(error_of([&] { comm->all_gather(t); }), HasSubstr("all_gather: unsupported dtype"));
    EXPECT_THAT(error_of([&] { comm->send(t, (rank + 1) % world); }),
                HasSubstr("send: unsupported dtype"));
  }
  torch::Tensor i = torch::ones({3}, torch::kInt64);
  EXPECT_THAT(error_of([&] { comm->all_reduce(i, ReduceOp::kAvg); }),
              HasSubstr("all_reduce: avg of int64 tensors is not supported"));
  torch::Tensor undefined;
  EXPECT_THAT(error_of([&] { comm->all_reduce(undefined); }),
              HasSubstr("all_reduce: the tensor is undefined"));
}

TEST_F(CommTest, MpiCheckReportsTheFailedCall) {
  MPI_Comm dup = dynamic_cast<MpiCommunicator&>(*comm).mpi_comm();  // errors return, not abort
  const std::string e =
      error_of([&] { GPT2P_MPI_CHECK(MPI_Send(nullptr, 0, MPI_INT, world + 5, 0, dup)); });
  EXPECT_THAT(e, HasSubstr("test_comm.cpp:"));
  EXPECT_THAT(e, HasSubstr("MPI call failed: MPI_Send(nullptr, 0, MPI_INT, world + 5, 0, dup): "));
  EXPECT_THAT(e, HasSubstr("rank"));
  EXPECT_THAT(e, HasSubstr("-- fix: "));
}

TEST(CommFactory, BackendsByName) {
  EXPECT_EQ(from_name<Backend>("mpi"), Backend::kMpi);
  EXPECT_EQ(from_name<Backend>("nccl"), Backend::kNccl);
  EXPECT_FALSE(from_name<Backend>("gloo").has_value());
  CommOptions options;
  options.check_sizes = false;
  auto comm = make_communicator(options);
  EXPECT_EQ(comm->backend_name(), "mpi");
#ifndef GPT2P_WITH_CUDA
  EXPECT_FALSE(nccl_available());
  options.backend = Backend::kNccl;
  const std::string e = error_of([&] { make_communicator(options); });
  EXPECT_THAT(e, HasSubstr("built without CUDA"));
  EXPECT_THAT(e, HasSubstr("rebuild against a CUDA libtorch, or use --device cpu"));
#endif
}

}  // namespace
}  // namespace gpt2p::comm
