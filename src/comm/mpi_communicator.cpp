#include "gpt2p/comm/mpi_communicator.h"

#include <array>
#include <utility>

#include "gpt2p/core/error.h"
#include "mpi_work.h"

namespace gpt2p::comm {
namespace {

using mpi::at;
using mpi::describe_op;
using mpi::for_chunks;
using mpi::mpi_op;
using mpi::MpiWork;
using mpi::stage_reduce;
using mpi::Staged;
using mpi::wire_type;

}  // namespace

namespace detail {

void check_same_collective(MPI_Comm comm, const char* op, int64_t numel, torch::ScalarType dtype,
                           int64_t extra, const char* extra_name,
                           std::chrono::milliseconds timeout) {
  const auto code = static_cast<int64_t>(dtype);
  std::array<int64_t, 6> v{numel, -numel, code, -code, extra, -extra};
  MPI_Request r = MPI_REQUEST_NULL;
  GPT2P_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, v.data(), static_cast<int>(v.size()), MPI_INT64_T,
                                 MPI_MAX, comm, &r));
  wait_all(&r, 1, timeout, [op] { return std::string(op) + ": the size check (MPI)"; });
  const char* hint =
      "every rank must make the same collective calls in the same order with tensors of the same "
      "size and dtype; print the shapes on each rank to find the odd one out";
  GPT2P_CHECK(v[0] == -v[1],
              op << ": ranks disagree on the number of elements: between " << -v[1] << " and "
                 << v[0] << " (this rank: " << numel << ")",
              hint);
  GPT2P_CHECK(
      v[2] == -v[3],
      op << ": ranks disagree on the dtype: " << dtype_name(static_cast<torch::ScalarType>(-v[3]))
         << " and " << dtype_name(static_cast<torch::ScalarType>(v[2]))
         << " (this rank: " << dtype_name(dtype) << ")",
      hint);
  GPT2P_CHECK(v[4] == -v[5],
              op << ": ranks disagree on the " << extra_name << ": between " << -v[5] << " and "
                 << v[4] << " (this rank: " << extra << ")",
              hint);
}

}  // namespace detail

MpiCommunicator::MpiCommunicator(MPI_Comm comm, MpiOptions options)
    : MpiCommunicator(
          [comm, timeout = options.timeout] {
            MPI_Comm dup = MPI_COMM_NULL;
            MPI_Request r = MPI_REQUEST_NULL;
            GPT2P_MPI_CHECK(MPI_Comm_idup(comm, &dup, &r));
            wait_all(&r, 1, timeout, [] { return std::string("creating the MPI communicator"); });
            GPT2P_MPI_CHECK(MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN));
            return Dup{dup};
          }(),
          options) {}

MpiCommunicator::MpiCommunicator(Dup dup, MpiOptions options)
    : Communicator(query_topology(dup.comm)), comm_(dup.comm), options_(options) {
  GPT2P_CHECK(
      options_.max_chunk_elements > 0 && options_.max_chunk_elements <= INT32_MAX,
      "MpiOptions::max_chunk_elements = " << options_.max_chunk_elements << " is outside [1, 2^31)",
      "leave it at its default (2^30)");
}

torch::Tensor MpiCommunicator::wire_buffer(const torch::Tensor& t, bool fill) const {
  if (t.is_cuda()) {
    // to(kCPU) waits for the current stream's work on t; a receive buffer needs no values.
    return fill ? t.to(torch::kCPU).contiguous()
                : torch::empty(t.sizes(), t.options().device(torch::kCPU));
  }
  return t.is_contiguous() ? t : t.contiguous();
}

void MpiCommunicator::wait(MPI_Request* requests, int count, const char* op, int peer) const {
  wait_all(requests, count, options_.timeout,
           [op, peer, world = size()] { return describe_op(op, peer, world); });
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized == 0 && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void MpiCommunicator::check_tag(int tag, const char* op) const {
  void* attr = nullptr;
  int found = 0;
  GPT2P_MPI_CHECK(MPI_Comm_get_attr(comm_, MPI_TAG_UB, &attr, &found));
  const int upper = found != 0 ? *static_cast<int*>(attr) : 32767;
  GPT2P_CHECK(tag >= 0 && tag <= upper, op << ": invalid tag " << tag,
              "use a tag in [0, " << upper << "]");
}

void MpiCommunicator::all_reduce(torch::Tensor& tensor, ReduceOp op) {
  check_tensor(tensor, "all_reduce");
  check_reduce(tensor, op, "all_reduce");
  if (options_.check_sizes) {
    detail::check_same_collective(comm_, "all_reduce", tensor.numel(), tensor.scalar_type(),
                                  static_cast<int64_t>(op), "reduce op (0 sum, 1 avg)",
                                  options_.timeout);
  }
  all_reduce_async(tensor, op)->wait();
}

WorkPtr MpiCommunicator::all_reduce_async(torch::Tensor& tensor, ReduceOp op) {
  check_tensor(tensor, "all_reduce_async");
  check_reduce(tensor, op, "all_reduce_async");
  Staged s = stage_reduce(tensor, op, size(), tensor.is_cuda());
  const MPI_Datatype type = wire_type(s.buffer.scalar_type());
  std::vector<MPI_Request> requests;
  for_chunks(s.buffer.numel(), options_.max_chunk_elements, [&](int64_t offset, int count) {
    MPI_Request r = MPI_REQUEST_NULL;
    GPT2P_MPI_CHECK(
        MPI_Iallreduce(MPI_IN_PLACE, at(s.buffer, offset), count, type, mpi_op(op), comm_, &r));
    requests.push_back(r);
  });
  // Keep the buffer alive even when there is nothing to finish.
  auto finish = [buffer = s.buffer, f = std::move(s.finish)] {
    if (f) f();
  };
  return std::make_unique<MpiWork>(std::move(requests), std::move(finish),
                                   MpiWork::Place{"all_reduce", -1, size(), options_.timeout});
}

void MpiCommunicator::broadcast(torch::Tensor& tensor, int root) {
  check_tensor(tensor, "broadcast");
  GPT2P_CHECK(
      root >= 0 && root < size(),
      "broadcast: invalid root rank " << root << " (communicator has " << size() << " ranks)",
      "pass a root in [0, " << size() << ")");
  if (options_.check_sizes) {
    detail::check_same_collective(comm_, "broadcast", tensor.numel(), tensor.scalar_type(), root,
                                  "root", options_.timeout);
  }
  torch::Tensor buffer = wire_buffer(tensor, rank() == root);
  const MPI_Datatype type = wire_type(buffer.scalar_type());
  std::vector<MPI_Request> requests;
  for_chunks(buffer.numel(), options_.max_chunk_elements, [&](int64_t offset, int count) {
    MPI_Request r = MPI_REQUEST_NULL;
    GPT2P_MPI_CHECK(MPI_Ibcast(at(buffer, offset), count, type, root, comm_, &r));
    requests.push_back(r);
  });
  wait(requests.data(), static_cast<int>(requests.size()), "broadcast", root);
  if (!buffer.is_same(tensor)) tensor.copy_(buffer);
}

torch::Tensor MpiCommunicator::all_gather(const torch::Tensor& input) {
  check_tensor(input, "all_gather");
  if (options_.check_sizes) {
    detail::check_same_collective(comm_, "all_gather", input.numel(), input.scalar_type(), 0, "-",
                                  options_.timeout);
  }
  std::vector<int64_t> shape{size()};
  shape.insert(shape.end(), input.sizes().begin(), input.sizes().end());
  torch::Tensor out = torch::empty(shape, input.options());
  all_gather_async(input, out)->wait();
  return out;
}

WorkPtr MpiCommunicator::all_gather_async(const torch::Tensor& input, torch::Tensor& output) {
  check_tensor(input, "all_gather_async");
  check_gather_output(input, output);
  const torch::Tensor in = wire_buffer(input, true);
  const int64_t n = in.numel();
  const MPI_Datatype type = wire_type(in.scalar_type());
  const MpiWork::Place place{"all_gather", -1, size(), options_.timeout};
  std::vector<MPI_Request> requests;
  if (n <= options_.max_chunk_elements) {
    torch::Tensor out = wire_buffer(output, false);
    if (n > 0) {
      MPI_Request r = MPI_REQUEST_NULL;
      GPT2P_MPI_CHECK(MPI_Iallgather(in.data_ptr(), static_cast<int>(n), type, out.data_ptr(),
                                     static_cast<int>(n), type, comm_, &r));
      requests.push_back(r);
    }
    return std::make_unique<MpiWork>(
        std::move(requests),
        [in, out, output]() mutable {
          if (!out.is_same(output)) output.copy_(out);
        },
        place);
  }
  // Large inputs: one gather per chunk into its own buffer, put into place when complete.
  std::vector<std::pair<int64_t, torch::Tensor>> parts;
  for_chunks(n, options_.max_chunk_elements, [&](int64_t offset, int count) {
    torch::Tensor tmp = torch::empty({size(), count}, in.options());
    MPI_Request r = MPI_REQUEST_NULL;
    GPT2P_MPI_CHECK(
        MPI_Iallgather(at(in, offset), count, type, tmp.data_ptr(), count, type, comm_, &r));
    requests.push_back(r);
    parts.emplace_back(offset, tmp);
  });
  auto finish = [in, output, parts = std::move(parts), world = size(), n] {
    torch::Tensor rows = output.view({world, n});
    for (const auto& [offset, tmp] : parts) rows.slice(1, offset, offset + tmp.size(1)).copy_(tmp);
  };
  return std::make_unique<MpiWork>(std::move(requests), std::move(finish), place);
}

void MpiCommunicator::reduce_scatter(const torch::Tensor& input, torch::Tensor& output,
                                     ReduceOp op) {
  check_tensor(input, "reduce_scatter");
  if (options_.check_sizes) {
    detail::check_same_collective(comm_, "reduce_scatter", input.numel(), input.scalar_type(),
                                  static_cast<int64_t>(op), "reduce op (0 sum, 1 avg)",
                                  options_.timeout);
  }
  reduce_scatter_async(input, output, op)->wait();
}

WorkPtr MpiCommunicator::reduce_scatter_async(const torch::Tensor& input, torch::Tensor& output,
                                              ReduceOp op) {
  check_tensor(input, "reduce_scatter");
  check_reduce(input, op, "reduce_scatter");
  check_scatter_output(input, output);
  // bfloat16 is summed in float32 (as all_reduce does); CUDA memory goes through the host.
  const auto wire = input.scalar_type() == torch::kBFloat16 ? torch::kFloat32 : input.scalar_type();
  const bool host = input.is_cuda();
  const auto where = host ? torch::Device(torch::kCPU) : input.device();
  const torch::Tensor in = input.to(input.options().device(where).dtype(wire)).contiguous();
  const bool direct = !host && output.scalar_type() == wire;
  torch::Tensor out = direct ? output : torch::empty({output.numel()}, in.options());
  const int64_t n = output.numel();
  const MPI_Datatype type = wire_type(wire);
  std::vector<MPI_Request> requests;
  std::vector<torch::Tensor> pieces;  // chunked sends: each rank's part of the chunk, contiguous
  if (n <= options_.max_chunk_elements) {
    if (n > 0) {
      MPI_Request r = MPI_REQUEST_NULL;
      GPT2P_MPI_CHECK(MPI_Ireduce_scatter_block(in.data_ptr(), out.data_ptr(), static_cast<int>(n),
                                                type, MPI_SUM, comm_, &r));
      requests.push_back(r);
    }
  } else {
    const torch::Tensor rows = in.view({size(), n});
    for_chunks(n, options_.max_chunk_elements, [&](int64_t offset, int count) {
      pieces.push_back(rows.narrow(1, offset, count).contiguous());
      MPI_Request r = MPI_REQUEST_NULL;
      GPT2P_MPI_CHECK(MPI_Ireduce_scatter_block(pieces.back().data_ptr(), at(out, offset), count,
                                                type, MPI_SUM, comm_, &r));
      requests.push_back(r);
    });
  }
  auto finish = [in, out, output, pieces, op, world = size(), direct]() mutable {
    if (op == ReduceOp::kAvg) out.div_(world);
    if (!direct) output.copy_(out.view_as(output));
  };
  return std::make_unique<MpiWork>(std::move(requests), std::move(finish),
                                   MpiWork::Place{"reduce_scatter", -1, size(), options_.timeout});
}

WorkPtr MpiCommunicator::send_async(const torch::Tensor& tensor, int peer, int tag) {
  check_tensor(tensor, "send");
  check_peer(peer, "send");
  check_tag(tag, "send");
  torch::Tensor buffer = wire_buffer(tensor, true);
  const MPI_Datatype type = wire_type(buffer.scalar_type());
  std::vector<MPI_Request> requests;
  for_chunks(buffer.numel(), options_.max_chunk_elements, [&](int64_t offset, int count) {
    MPI_Request r = MPI_REQUEST_NULL;
    GPT2P_MPI_CHECK(MPI_Isend(at(buffer, offset), count, type, peer, tag, comm_, &r));
    requests.push_back(r);
  });
  return std::make_unique<MpiWork>(
      std::move(requests), [buffer] {}, MpiWork::Place{"send", peer, size(), options_.timeout});
}

WorkPtr MpiCommunicator::recv_async(torch::Tensor& tensor, int peer, int tag) {
  check_tensor(tensor, "recv");
  check_peer(peer, "recv");
  check_tag(tag, "recv");
  torch::Tensor buffer = wire_buffer(tensor, false);
  const MPI_Datatype type = wire_type(buffer.scalar_type());
  std::vector<MPI_Request> requests;
  for_chunks(buffer.numel(), options_.max_chunk_elements, [&](int64_t offset, int count) {
    MPI_Request r = MPI_REQUEST_NULL;
    GPT2P_MPI_CHECK(MPI_Irecv(at(buffer, offset), count, type, peer, tag, comm_, &r));
    requests.push_back(r);
  });
  return std::make_unique<MpiWork>(
      std::move(requests),
      [tensor, buffer]() mutable {
        if (!buffer.is_same(tensor)) tensor.copy_(buffer);
      },
      MpiWork::Place{"recv", peer, size(), options_.timeout});
}

void MpiCommunicator::barrier() { gpt2p::barrier(comm_, options_.timeout, "barrier"); }

}  // namespace gpt2p::comm
