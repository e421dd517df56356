// The MPI backend of the Communicator: tensors over a duplicate of an MPI communicator.
//
// CPU tensors go to MPI as they are. CUDA tensors (--comm mpi on GPUs) always go through host
// memory, also where MPI is CUDA-aware: a call first copies to the host, which waits for the work
// queued on torch's current stream, and results are in the caller's tensor, copied back on the
// current stream, when a blocking call or wait() returns. (Handing device pointers to a CUDA-aware
// MPI would skip the copies; that path was never run, so it is not offered.)
//
// Every wait is polled against `timeout` (mpi_wait.h): a stuck or dead peer throws, naming the
// operation and its peer, instead of hanging.
//
// MPI has no bfloat16: reductions convert to float32, reduce, and round back once; moves
// (broadcast, all_gather, send/recv) ship the raw 16-bit words. MPI counts are `int`, so tensors
// of more than `max_chunk_elements` elements go in several calls (same order on every rank, and
// MPI keeps messages of one (peer, tag) in order, so chunks of a send match chunks of its recv).
#pragma once

#include <cstdint>

#include "gpt2p/comm/communicator.h"
#include "gpt2p/core/mpi_wait.h"

namespace gpt2p::comm {

struct MpiOptions {
  // See CommOptions::check_sizes.
  bool check_sizes = true;
  // Most elements in one MPI call; tests lower it to exercise chunking without 8 GB buffers.
  int64_t max_chunk_elements = int64_t{1} << 30;
  // Longest wait on one operation before it throws (--comm-timeout).
  std::chrono::milliseconds timeout = kDefaultCommTimeout;
  // Where the tensors live: CPU, or the rank's GPU (staged as described above).
  torch::Device device = torch::kCPU;
};

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm comm, MpiOptions options = {});
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  Backend backend() const override { return Backend::kMpi; }
  std::string backend_name() const override { return "mpi"; }
  torch::Device device() const override { return options_.device; }

  void all_reduce(torch::Tensor& tensor, ReduceOp op = ReduceOp::kSum) override;
  using Communicator::all_reduce;
  WorkPtr all_reduce_async(torch::Tensor& tensor, ReduceOp op = ReduceOp::kSum) override;
  void broadcast(torch::Tensor& tensor, int root) override;
  torch::Tensor all_gather(const torch::Tensor& input) override;
  WorkPtr all_gather_async(const torch::Tensor& input, torch::Tensor& output) override;
  void reduce_scatter(const torch::Tensor& input, torch::Tensor& output,
                      ReduceOp op = ReduceOp::kSum) override;
  WorkPtr reduce_scatter_async(const torch::Tensor& input, torch::Tensor& output,
                               ReduceOp op = ReduceOp::kSum) override;
  WorkPtr send_async(const torch::Tensor& tensor, int peer, int tag = 0) override;
  WorkPtr recv_async(torch::Tensor& tensor, int peer, int tag = 0) override;
  void barrier() override;

  // Our duplicate of the communicator given to the constructor.
  MPI_Comm mpi_comm() const { return comm_; }

 private:
  struct Dup {
    MPI_Comm comm;
  };
  MpiCommunicator(Dup dup, MpiOptions options);
  void check_tag(int tag, const char* op) const;
  // The tensor MPI reads/writes for `t`: t itself (CPU, contiguous) or a contiguous copy on the
  // host. `fill`: copy t's values (false: a receive buffer).
  torch::Tensor wire_buffer(const torch::Tensor& t, bool fill) const;
  void wait(MPI_Request* requests, int count, const char* op, int peer) const;

  MPI_Comm comm_;
  MpiOptions options_;
};

namespace detail {

// The size-agreement check described in communicator.h: one MPI_Allreduce(MAX) of
// {numel, -numel, dtype, -dtype, extra, -extra} on `comm`; throws the same error on every rank
// when they disagree. `extra` is what else must match (reduce op, broadcast root, list length).
void check_same_collective(MPI_Comm comm, const char* op, int64_t numel, torch::ScalarType dtype,
                           int64_t extra, const char* extra_name,
                           std::chrono::milliseconds timeout = kDefaultCommTimeout);

}  // namespace detail
}  // namespace gpt2p::comm
