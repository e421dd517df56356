// The NCCL backend (compiled only with GPT2P_WITH_CUDA). Made from the MPI one: MPI bootstraps it
// (unique id broadcast) and carries the size-agreement check; NCCL moves the data.
//
// Streams, per call (see communicator.h):
//   current stream --[ready event]--> our stream: NCCL kernels --[done event]--> Work
//   Work::wait():        current stream waits on `done` (no host block), then copies back
//   Work::synchronize(): host polls `done` and ncclCommGetAsyncError until the timeout
//   the watchdog thread: every `done` in order; one not done past the timeout (+ a grace) aborts
//   the communicator and ends the job, wherever the host waits (nccl_work.h)
// The Work, its event and the shared communicator state live in nccl_work.h.
#include "gpt2p/comm/nccl_communicator.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <chrono>
#include <functional>
#include <thread>
#include <utility>

#include "gpt2p/comm/cuda_check.h"
#include "gpt2p/comm/mpi_communicator.h"
#include "gpt2p/core/mpi_wait.h"
#include "nccl_work.h"

namespace gpt2p::comm {
namespace {

using nccl::Event;
using nccl::NcclState;
using nccl::NcclWork;
using nccl::stage;
using nccl::Staged;

ncclDataType_t nccl_type(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat32: return ncclFloat32;
    case torch::kFloat64: return ncclFloat64;
    case torch::kInt32: return ncclInt32;
    case torch::kInt64: return ncclInt64;
    case torch::kBFloat16: return ncclBfloat16;
    default:
      GPT2P_FAIL("no NCCL type for dtype " << dtype_name(t),
                 "this is a bug: check_tensor let it through");
  }
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::kSum ? ncclSum : ncclAvg; }

// The GPU of options.device when it names one (a communicator over a subgroup of the job, whose
// own local ranks are not the node's), else the local rank's.
int pick_device(const Topology& topo, const torch::Device& requested) {
  int count = 0;
  GPT2P_CUDA_CHECK(cudaGetDeviceCount(&count));
  if (requested.is_cuda() && requested.has_index()) {
    const int index = requested.index();
    GPT2P_CHECK(index >= 0 && index < count,
                "the NCCL communicator was asked for cuda:"
                    << index << " but " << topo.host << " has " << count << " visible GPU(s)",
                "this is a bug: pass the rank's own GPU in CommOptions::device");
    GPT2P_CUDA_CHECK(cudaSetDevice(index));
    return index;
  }
  GPT2P_CHECK(topo.local_rank < count,
              "rank " << topo.rank << " is local rank " << topo.local_rank << " on " << topo.host
                      << " but that host has only " << count << " visible GPU(s)",
              "start at most one rank per GPU on each host (mpirun -npernode <gpus>), or check "
              "CUDA_VISIBLE_DEVICES");
  GPT2P_CUDA_CHECK(cudaSetDevice(topo.local_rank));
  return topo.local_rank;
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(MPI_Comm dup, const CommOptions& options)
      : Communicator(query_topology(dup)),
        mpi_comm_(dup),
        check_sizes_(options.check_sizes),
        state_(std::make_shared<NcclState>()),
        device_(pick_device(topology(), options.device)),
        stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/true,
                                             static_cast<c10::DeviceIndex>(device_))) {
    state_->device = device_;
    state_->timeout = options.timeout;
    ncclUniqueId id{};
    if (rank() == 0) GPT2P_NCCL_CHECK(ncclGetUniqueId(&id));
    broadcast_bytes(&id, static_cast<int>(sizeof(id)), 0, mpi_comm_, options.timeout,
                    "sending the NCCL unique id");
    GPT2P_NCCL_CHECK(ncclCommInitRank(&state_->comm, size(), id, rank()));
    state_->start_watchdog();
    // NCCL connects peers lazily, inside the first collective's host call, which then blocks
    // until every peer joins. One collective now, while all ranks are known to be here, moves
    // that wait out of the training loop and lets a later dead peer surface as a timeout in
    // Work::synchronize() instead of a hang in the enqueue.
    barrier();
  }

  ~NcclCommunicator() override {
    state_.reset();  // destroys the NCCL communicator unless Works still hold it
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized == 0) MPI_Comm_free(&mpi_comm_);
  }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  Backend backend() const override { return Backend::kNccl; }
  std::string backend_name() const override { return "nccl"; }
  torch::Device device() const override {
    return {torch::kCUDA, static_cast<c10::DeviceIndex>(device_)};
  }

  void all_reduce(torch::Tensor& tensor, ReduceOp op) override {
    check_tensor(tensor, "all_reduce");
    check_reduce(tensor, op, "all_reduce");
    if (check_sizes_) {
      detail::check_same_collective(mpi_comm_, "all_reduce", tensor.numel(), tensor.scalar_type(),
                                    static_cast<int64_t>(op), "reduce op (0 sum, 1 avg)");
    }
    all_reduce_async(tensor, op)->wait();
  }

  void all_reduce(std::vector<torch::Tensor>& tensors, ReduceOp op) override {
    int64_t total = 0;
    std::vector<Staged> staged;
    std::vector<torch::Tensor> keep;
    for (auto& t : tensors) {
      check_tensor(t, "all_reduce(list)");
      check_reduce(t, op, "all_reduce(list)");
      total += t.numel();
      staged.push_back(stage(t));
      keep.push_back(staged.back().buffer);
    }
    if (check_sizes_) {
      detail::check_same_collective(mpi_comm_, "all_reduce(list)", total,
                                    tensors.empty() ? torch::kFloat32 : tensors[0].scalar_type(),
                                    static_cast<int64_t>(tensors.size()), "list length");
    }
    auto finish = [staged] {
      for (const auto& s : staged) {
        if (s.finish) s.finish();
      }
    };
    enqueue(std::move(keep), finish, [&](cudaStream_t stream) {
      GPT2P_NCCL_CHECK(ncclGroupStart());
      for (const auto& s : staged) {
        if (s.buffer.numel() == 0) continue;
        GPT2P_NCCL_CHECK(ncclAllReduce(
            s.buffer.data_ptr(), s.buffer.data_ptr(), static_cast<size_t>(s.buffer.numel()),
            nccl_type(s.buffer.scalar_type()), nccl_op(op), state_->comm, stream));
      }
      GPT2P_NCCL_CHECK(ncclGroupEnd());
    })->wait();
  }

  WorkPtr all_reduce_async(torch::Tensor& tensor, ReduceOp op) override {
    check_tensor(tensor, "all_reduce_async");
    check_reduce(tensor, op, "all_reduce_async");
    Staged s = stage(tensor);
    return enqueue({s.buffer}, s.finish, [&](cudaStream_t stream) {
      if (s.buffer.numel() == 0) return;
      GPT2P_NCCL_CHECK(ncclAllReduce(
          s.buffer.data_ptr(), s.buffer.data_ptr(), static_cast<size_t>(s.buffer.numel()),
          nccl_type(s.buffer.scalar_type()), nccl_op(op), state_->comm, stream));
    });
  }

  void broadcast(torch::Tensor& tensor, int root) override {
    check_tensor(tensor, "broadcast");
    GPT2P_CHECK(
        root >= 0 && root < size(),
        "broadcast: invalid root rank " << root << " (communicator has " << size() << " ranks)",
        "pass a root in [0, " << size() << ")");
    if (check_sizes_) {
      detail::check_same_collective(mpi_comm_, "broadcast", tensor.numel(), tensor.scalar_type(),
                                    root, "root");
    }
    Staged s = stage(tensor);
    enqueue({s.buffer}, s.finish, [&](cudaStream_t stream) {
      if (s.buffer.numel() == 0) return;
      GPT2P_NCCL_CHECK(ncclBroadcast(
          s.buffer.data_ptr(), s.buffer.data_ptr(), static_cast<size_t>(s.buffer.numel()),
          nccl_type(s.buffer.scalar_type()), root, state_->comm, stream));
    })->wait();
  }

  torch::Tensor all_gather(const torch::Tensor& input) override {
    check_tensor(input, "all_gather");
    if (check_sizes_) {
      detail::check_same_collective(mpi_comm_, "all_gather", input.numel(), input.scalar_type(), 0,
                                    "-");
    }
    const torch::Tensor in = input.contiguous();
    std::vector<int64_t> shape{size()};
    shape.insert(shape.end(), input.sizes().begin(), input.sizes().end());
    torch::Tensor out = torch::empty(shape, input.options());
    enqueue({in, out}, nullptr, [&](cudaStream_t stream) {
      if (in.numel() == 0) return;
      GPT2P_NCCL_CHECK(ncclAllGather(in.data_ptr(), out.data_ptr(), static_cast<size_t>(in.numel()),
                                     nccl_type(in.scalar_type()), state_->comm, stream));
    })->wait();
    return out;
  }

  WorkPtr all_gather_async(const torch::Tensor& input, torch::Tensor& output) override {
    check_tensor(input, "all_gather_async");
    check_gather_output(input, output);
    const torch::Tensor in = input.contiguous();
    return enqueue({in, output}, nullptr, [&](cudaStream_t stream) {
      if (in.numel() == 0) return;
      GPT2P_NCCL_CHECK(ncclAllGather(in.data_ptr(), output.data_ptr(),
                                     static_cast<size_t>(in.numel()), nccl_type(in.scalar_type()),
                                     state_->comm, stream));
    });
  }

  void reduce_scatter(const torch::Tensor& input, torch::Tensor& output, ReduceOp op) override {
    check_tensor(input, "reduce_scatter");
    if (check_sizes_) {
      detail::check_same_collective(mpi_comm_, "reduce_scatter", input.numel(), input.scalar_type(),
                                    static_cast<int64_t>(op), "reduce op (0 sum, 1 avg)");
    }
    reduce_scatter_async(input, output, op)->wait();
  }

  WorkPtr reduce_scatter_async(const torch::Tensor& input, torch::Tensor& output,
                               ReduceOp op) override {
    check_tensor(input, "reduce_scatter");
    check_reduce(input, op, "reduce_scatter");
    check_scatter_output(input, output);
    const torch::Tensor in = input.contiguous();
    return enqueue({in, output}, nullptr, [&](cudaStream_t stream) {
      if (output.numel() == 0) return;
      GPT2P_NCCL_CHECK(
          ncclReduceScatter(in.data_ptr(), output.data_ptr(), static_cast<size_t>(output.numel()),
                            nccl_type(in.scalar_type()), nccl_op(op), state_->comm, stream));
    });
  }

  // Tags are not used by NCCL: messages between two ranks match in call order.
  WorkPtr send_async(const torch::Tensor& tensor, int peer, int /*tag*/) override {
    check_tensor(tensor, "send");
    check_peer(peer, "send");
    const torch::Tensor buffer = tensor.contiguous();
    return enqueue({buffer}, nullptr, [&](cudaStream_t stream) {
      if (buffer.numel() == 0) return;
      GPT2P_NCCL_CHECK(ncclSend(buffer.data_ptr(), static_cast<size_t>(buffer.numel()),
                                nccl_type(buffer.scalar_type()), peer, state_->comm, stream));
    });
  }

  WorkPtr recv_async(torch::Tensor& tensor, int peer, int /*tag*/) override {
    check_tensor(tensor, "recv");
    check_peer(peer, "recv");
    Staged s = stage(tensor);
    return enqueue({s.buffer}, s.finish, [&](cudaStream_t stream) {
      if (s.buffer.numel() == 0) return;
      GPT2P_NCCL_CHECK(ncclRecv(s.buffer.data_ptr(), static_cast<size_t>(s.buffer.numel()),
                                nccl_type(s.buffer.scalar_type()), peer, state_->comm, stream));
    });
  }

  // One NCCL group for the whole batch; every Work waits on the group's completion.
  std::vector<WorkPtr> batch_isend_irecv(std::vector<P2POp>& ops) override {
    std::vector<Staged> staged;
    std::vector<torch::Tensor> keep;
    for (auto& op : ops) {
      const bool send = op.kind == P2POp::Kind::kSend;
      check_tensor(op.tensor, send ? "batch_isend_irecv(send)" : "batch_isend_irecv(recv)");
      check_peer(op.peer, send ? "batch_isend_irecv(send)" : "batch_isend_irecv(recv)");
      staged.push_back(send ? Staged{op.tensor.contiguous(), nullptr} : stage(op.tensor));
      keep.push_back(staged.back().buffer);
    }
    auto done = launch(keep, [&](cudaStream_t stream) {
      GPT2P_NCCL_CHECK(ncclGroupStart());
      for (size_t i = 0; i < ops.size(); ++i) {
        const torch::Tensor& b = staged[i].buffer;
        if (b.numel() == 0) continue;
        const auto count = static_cast<size_t>(b.numel());
        if (ops[i].kind == P2POp::Kind::kSend) {
          GPT2P_NCCL_CHECK(ncclSend(b.data_ptr(), count, nccl_type(b.scalar_type()), ops[i].peer,
                                    state_->comm, stream));
        } else {
          GPT2P_NCCL_CHECK(ncclRecv(b.data_ptr(), count, nccl_type(b.scalar_type()), ops[i].peer,
                                    state_->comm, stream));
        }
      }
      GPT2P_NCCL_CHECK(ncclGroupEnd());
    });
    std::vector<WorkPtr> works;
    for (auto& s : staged) {
      works.push_back(
          std::make_unique<NcclWork>(state_, done, std::vector<torch::Tensor>{s.buffer}, s.finish));
    }
    return works;
  }

  // A one-element all_reduce, then the host waits for it (with the timeout).
  void barrier() override {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
    torch::Tensor one =
        torch::ones({1}, torch::TensorOptions().dtype(torch::kFloat32).device(device()));
    all_reduce_async(one, ReduceOp::kSum)->synchronize();
  }

 private:
  // Orders `calls` (NCCL on our stream) after the caller's current stream, records the tensors on
  // our stream for the caching allocator, and returns the Work that waits for them.
  template <class Calls>
  WorkPtr enqueue(std::vector<torch::Tensor> keep, std::function<void()> finish, Calls&& calls) {
    auto done = launch(keep, std::forward<Calls>(calls));
    return std::make_unique<NcclWork>(state_, std::move(done), std::move(keep), std::move(finish));
  }

  // The stream handshake of enqueue(); returns the event recorded after `calls`.
  template <class Calls>
  std::shared_ptr<Event> launch(const std::vector<torch::Tensor>& keep, Calls&& calls) {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
    const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device_);
    Event ready;
    ready.record(current.stream());
    ready.block(stream_.stream());
    calls(stream_.stream());
    for (const auto& t : keep) {
      c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), stream_);
    }
    auto done = std::make_shared<Event>();
    done->record(stream_.stream());
    state_->watch(done);
    return done;
  }

  MPI_Comm mpi_comm_;
  bool check_sizes_;
  std::shared_ptr<NcclState> state_;
  int device_;
  c10::cuda::CUDAStream stream_;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm, const CommOptions& options) {
  MPI_Comm dup = MPI_COMM_NULL;
  MPI_Request r = MPI_REQUEST_NULL;
  GPT2P_MPI_CHECK(MPI_Comm_idup(comm, &dup, &r));
  wait_all(&r, 1, options.timeout,
           [] { return std::string("creating the NCCL communicator's MPI group"); });
  GPT2P_MPI_CHECK(MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN));
  return std::make_unique<NcclCommunicator>(dup, options);
}

}  // namespace gpt2p::comm
