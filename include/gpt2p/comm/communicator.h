// The Communicator: one interface for every collective and point-to-point operation the trainers
// use, with an MPI backend (CPU tensors) and an NCCL backend (CUDA tensors).
//
// Contract (same spirit as c10d's ProcessGroupNCCL):
//  * Collectives (all_reduce, reduce_scatter, broadcast, all_gather, barrier) must be called by
//    every rank of the communicator in the same order, with tensors of the same dtype and number
//    of elements.
//    Point-to-point calls need a matching call on the peer with the same tag, size and dtype.
//  * MPI backend: every call runs on the calling thread. Blocking calls return when the result is
//    in place; *_async calls return a Work whose wait() blocks until it is. Its tensors live on
//    the CPU or (--comm mpi on GPUs) on the rank's GPU: then every call first waits for the work
//    queued on torch's current stream (the copy to host memory does), and the result is back in
//    the caller's tensor when the
//    blocking call or wait() returns. Every wait is polled against the timeout, past which it
//    throws naming the operation and the peer: a stopped or stuck peer fails the job.
//  * NCCL backend: every call is enqueued on the communicator's own CUDA stream, which first waits
//    (by a CUDA event) for the work already queued on torch's current stream of the caller, so the
//    inputs are ready. "Blocking" calls then make torch's current stream wait for the result (an
//    event again): the host does not block, and later kernels on the current stream see the result.
//    *_async calls return a Work; Work::wait() makes the *then-current* stream wait, also without
//    blocking the host. Work::synchronize() blocks the host, polling ncclCommGetAsyncError; past
//    the communicator's timeout it aborts the NCCL communicator and throws, so a dead or stuck peer
//    fails the job instead of hanging it. Lists of tensors go in one NCCL group.
//  * Point-to-point on NCCL: sends and receives queue on the one stream in call order, and each
//    waits there until its peer has posted the matching call. Two ranks that each send to the
//    other before receiving therefore deadlock (1F1B's steady state does exactly that). Two ways
//    out: post an independent send/receive pair together with batch_isend_irecv (one NCCL group,
//    as torch.distributed's batch_isend_irecv does) -- but a group whose receive needs the peer to
//    use the group's own send first hangs (seen on 2xH200) -- or give each direction its own
//    communicator, as pp_train does. MPI calls never block there.
//  * Tensors passed to *_async calls must stay alive and unmodified until wait() returns (the
//    NCCL backend also records them on its stream for torch's caching allocator).
//  * Supported dtypes: float32, float64, int32, int64, bfloat16 (MPI reduces bfloat16 in float32
//    and rounds back once; NCCL reduces it natively). Avg needs a floating dtype. Tensors of any
//    layout work: non-contiguous ones go through a contiguous copy and are copied back.
//  * Size agreement (CommOptions::check_sizes, on by default): blocking all_reduce (single and
//    list), broadcast and all_gather first run one MPI_Allreduce of 6 int64 over the MPI
//    communicator (numel, dtype and op/root as max and -max), so ranks that disagree all throw the
//    same clear error instead of hanging or corrupting memory. It costs one tiny host-side
//    collective per call; *_async calls and point-to-point calls are not checked.
//  * Errors (mismatched sizes, invalid peers or tags, unsupported dtypes, library failures) throw
//    gpt2p::Error naming rank, host, file:line and a fix.
#pragma once

#include <torch/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "gpt2p/comm/backend.h"
#include "gpt2p/core/mpi_env.h"

namespace gpt2p::comm {

enum class ReduceOp { kSum, kAvg };

// One transfer of a batch_isend_irecv call.
struct P2POp {
  enum class Kind { kSend, kRecv };
  Kind kind = Kind::kSend;
  torch::Tensor tensor;  // send: read until the Work is waited for; recv: written
  int peer = -1;
  int tag = 0;
};

// A handle on an operation in flight.
class Work {
 public:
  virtual ~Work() = default;
  // MPI: block until complete. NCCL: order torch's current stream after the operation (no host
  // wait).
  virtual void wait() = 0;
  // Block the host until the operation has completed (NCCL: polls for async errors, with timeout).
  virtual void synchronize() { wait(); }
  // True when the operation has completed (never blocks).
  virtual bool is_completed() = 0;
};
using WorkPtr = std::unique_ptr<Work>;

struct CommOptions {
  Backend backend = Backend::kMpi;
  // How long any wait on a peer may take before the job is failed (NCCL: synchronize() and
  // blocking calls; MPI: every wait).
  std::chrono::milliseconds timeout{60000};
  // MPI backend: where its tensors live (CPU, or this rank's GPU when ranks share GPUs). NCCL: the
  // GPU when it names one (needed for a communicator over a subgroup, whose local ranks are not
  // the node's); else the local rank's GPU.
  torch::Device device = torch::kCPU;
  // Check that every rank passes the same number of elements/dtype to blocking collectives (above).
  bool check_sizes = true;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual Backend backend() const = 0;
  virtual std::string backend_name() const = 0;
  int rank() const { return topo_.rank; }
  int size() const { return topo_.size; }
  int local_rank() const { return topo_.local_rank; }
  const Topology& topology() const { return topo_; }
  // The device tensors must live on: CPU for MPI, cuda:<local GPU> for NCCL.
  virtual torch::Device device() const = 0;

  // In place. A list is flattened into one buffer (one NCCL group / one MPI call) and copied back.
  virtual void all_reduce(torch::Tensor& tensor, ReduceOp op = ReduceOp::kSum);
  virtual void all_reduce(std::vector<torch::Tensor>& tensors, ReduceOp op = ReduceOp::kSum);
  virtual WorkPtr all_reduce_async(torch::Tensor& tensor, ReduceOp op = ReduceOp::kSum) = 0;

  virtual void broadcast(torch::Tensor& tensor, int root) = 0;
  // Returns a tensor of shape [size, ...input shape] holding every rank's input in rank order.
  virtual torch::Tensor all_gather(const torch::Tensor& input) = 0;
  // The same into `output` ([size, ...input shape], contiguous, input's dtype and device), without
  // the size check; both tensors must stay alive until wait(). The base version runs all_gather
  // and copies (complete on return); the MPI and NCCL backends overlap it.
  virtual WorkPtr all_gather_async(const torch::Tensor& input, torch::Tensor& output);

  // Reduces `input` over the ranks and leaves this rank's part of the result in `output`: with n =
  // output's elements, rank r gets elements [r*n, (r+1)*n) of the flattened reduction (the inverse
  // of all_gather: ZeRO's gradient shards). input holds size()*n elements; output is contiguous,
  // of input's dtype and device, and does not overlap input. The blocking form checks that every
  // rank passes the same sizes (check_sizes); the async one does not, and both tensors must stay
  // alive until wait(). The base versions all_reduce a copy and keep this rank's part.
  virtual void reduce_scatter(const torch::Tensor& input, torch::Tensor& output,
                              ReduceOp op = ReduceOp::kSum);
  virtual WorkPtr reduce_scatter_async(const torch::Tensor& input, torch::Tensor& output,
                                       ReduceOp op = ReduceOp::kSum);

  virtual void send(const torch::Tensor& tensor, int peer, int tag = 0);
  virtual void recv(torch::Tensor& tensor, int peer, int tag = 0);
  virtual WorkPtr send_async(const torch::Tensor& tensor, int peer, int tag = 0) = 0;
  virtual WorkPtr recv_async(torch::Tensor& tensor, int peer, int tag = 0) = 0;
  // Posts every op at once and returns one Work per op, in order. NCCL: one group, so the ops
  // progress together and the batch completes when all have (see the contract above). The base
  // version posts send_async/recv_async in order, right for backends whose calls never block.
  virtual std::vector<WorkPtr> batch_isend_irecv(std::vector<P2POp>& ops);

  virtual void barrier() = 0;

 protected:
  explicit Communicator(Topology topo) : topo_(std::move(topo)) {}
  // Shared argument checks, each with a clear error: peer in [0, size) and not this rank; tensor
  // defined, on device(), of a supported dtype; avg only on floating dtypes.
  void check_peer(int peer, const char* op) const;
  void check_tensor(const torch::Tensor& t, const char* op) const;
  void check_reduce(const torch::Tensor& t, ReduceOp op, const char* what) const;
  // all_gather_async's output: [size, ...input shape], contiguous, input's dtype and device.
  void check_gather_output(const torch::Tensor& input, const torch::Tensor& output) const;
  // reduce_scatter's output: input.numel() / size() elements, contiguous, input's dtype and
  // device, not overlapping input.
  void check_scatter_output(const torch::Tensor& input, const torch::Tensor& output) const;

 private:
  Topology topo_;
};

// The MPI backend on `comm` (duplicated, so our traffic never mixes with the caller's).
std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm = MPI_COMM_WORLD);

// The backend named in `options`. NCCL: bootstraps from MPI (rank 0 makes the ncclUniqueId,
// MPI_Bcast sends it), picks GPU local_rank, and fails with a clear message when built without
// CUDA.
std::unique_ptr<Communicator> make_communicator(const CommOptions& options,
                                                MPI_Comm comm = MPI_COMM_WORLD);

const char* reduce_op_name(ReduceOp op);
// Torch's name of a dtype ("float32", "bfloat16", "int8", ...), for messages.
std::string dtype_name(torch::ScalarType type);
// True when this build has the NCCL backend (compiled against a CUDA libtorch).
bool nccl_available();

}  // namespace gpt2p::comm
