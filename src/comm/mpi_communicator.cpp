#include "gpt2p/comm/mpi_communicator.h"

#include <algorithm>
#include <array>
#include <functional>
#include <utility>

#include "gpt2p/core/error.h"

namespace gpt2p::comm {
namespace {

// The MPI type that moves a dtype's bytes unchanged (bfloat16 travels as raw 16-bit words).
MPI_Datatype wire_type(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat32:
      return MPI_FLOAT;
    case torch::kFloat64:
      return MPI_DOUBLE;
    case torch::kInt32:
      return MPI_INT32_T;
    case torch::kInt64:
      return MPI_INT64_T;
    case torch::kBFloat16:
      return MPI_UINT16_T;
    default:
      GPT2P_FAIL("no MPI type for dtype " << dtype_name(t),
                 "this is a bug: check_tensor let it through");
  }
}

MPI_Op mpi_op(ReduceOp) { return MPI_SUM; }  // avg = sum, then divide by the world size

// Calls f(element_offset, count) for consecutive pieces of at most `chunk` elements.
template <class F>
void for_chunks(int64_t numel, int64_t chunk, F&& f) {
  for (int64_t offset = 0; offset < numel; offset += chunk) {
    f(offset, static_cast<int>(std::min(chunk, numel - offset)));
  }
}

char* at(const torch::Tensor& t, int64_t element) {
  return static_cast<char*>(t.data_ptr()) + element * static_cast<int64_t>(t.element_size());
}

// Operation in flight: MPI requests, then `finish` (divide for avg, copy back into the caller's
// tensor) once they are complete. Captured tensors stay alive until then.
class MpiWork final : public Work {
 public:
  MpiWork(std::vector<MPI_Request> requests, std::function<void()> finish)
      : requests_(std::move(requests)), finish_(std::move(finish)) {}
  ~MpiWork() override {
    // A Work dropped without wait() must not leave MPI writing into freed memory.
    if (!done_) {
      try {
        wait();
      } catch (...) {  // NOLINT(bugprone-empty-catch): never throw from a destructor
      }
    }
  }
  MpiWork(const MpiWork&) = delete;
  MpiWork& operator=(const MpiWork&) = delete;

  void wait() override {
    if (done_) return;
    done_ = true;
    GPT2P_MPI_CHECK(
        MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE));
    if (finish_) finish_();
  }

  bool is_completed() override {
    if (done_) return true;
    int flag = 0;
    GPT2P_MPI_CHECK(MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &flag,
                                MPI_STATUSES_IGNORE));
    if (flag != 0) wait();  // requests are now MPI_REQUEST_NULL: this only runs finish
    return done_;
  }

 private:
  std::vector<MPI_Request> requests_;
  std::function<void()> finish_;
  bool done_ = false;
};

// A reduction's buffer: contiguous, in a dtype MPI can sum (bfloat16 -> float32), and the step
// that brings the result back into the caller's tensor.
struct Staged {
  torch::Tensor buffer;
  std::function<void()> finish;
};

Staged stage_reduce(torch::Tensor& tensor, ReduceOp op, int world) {
  Staged s;
  bool copy_back = true;
  if (tensor.scalar_type() == torch::kBFloat16) {
    s.buffer = tensor.to(torch::kFloat32).contiguous();
  } else if (!tensor.is_contiguous()) {
    s.buffer = tensor.contiguous();
  } else {
    s.buffer = tensor;
    copy_back = false;
  }
  if (op == ReduceOp::kAvg || copy_back) {
    s.finish = [tensor, buffer = s.buffer, op, world, copy_back]() mutable {
      if (op == ReduceOp::kAvg) buffer.div_(world);
      if (copy_back) tensor.copy_(buffer);
    };
  }
  return s;
}

// A buffer to move bytes from/into: the tensor itself when contiguous, else a contiguous copy.
torch::Tensor contiguous_buffer(const torch::Tensor& t) {
  return t.is_contiguous() ? t : t.contiguous();
}

}  // namespace

namespace detail {

void check_same_collective(MPI_Comm comm, const char* op, int64_t numel, torch::ScalarType dtype,
                           int64_t extra, const char* extra_name) {
  const auto code = static_cast<int64_t>(dtype);
  std::array<int64_t, 6> v{numel, -numel, code, -code, extra, -extra};
  GPT2P_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, v.data(), static_cast<int>(v.size()), MPI_INT64_T,
                                MPI_MAX, comm));
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
          [comm] {
            MPI_Comm dup = MPI_COMM_NULL;
            GPT2P_MPI_CHECK(MPI_Comm_dup(comm, &dup));
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
                                  static_cast<int64_t>(op), "reduce op (0 sum, 1 avg)");
  }
  Staged s = stage_reduce(tensor, op, size());
  const MPI_Datatype type = wire_type(s.buffer.scalar_type());
  for_chunks(s.buffer.numel(), options_.max_chunk_elements, [&](int64_t offset, int count) {
    GPT2P_MPI_CHECK(
        MPI_Allreduce(MPI_IN_PLACE, at(s.buffer, offset), count, type, mpi_op(op), comm_));
  });
  if (s.finish) s.finish();
}

WorkPtr MpiCommunicator::all_reduce_async(torch::Tensor& tensor, ReduceOp op) {
  check_tensor(tensor, "all_reduce_async");
  check_reduce(tensor, op, "all_reduce_async");
  Staged s = stage_reduce(tensor, op, size());
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
  return std::make_unique<MpiWork>(std::move(requests), std::move(finish));
}

void MpiCommunicator::broadcast(torch::Tensor& tensor, int root) {
  check_tensor(tensor, "broadcast");
  GPT2P_CHECK(
      root >= 0 && root < size(),
      "broadcast: invalid root rank " << root << " (communicator has " << size() << " ranks)",
      "pass a root in [0, " << size() << ")");
  if (options_.check_sizes) {
    detail::check_same_collective(comm_, "broadcast", tensor.numel(), tensor.scalar_type(), root,
                                  "root");
  }
  torch::Tensor buffer = contiguous_buffer(tensor);
  const MPI_Datatype type = wire_type(buffer.scalar_type());
  for_chunks(buffer.numel(), options_.max_chunk_elements, [&](int64_t offset, int count) {
    GPT2P_MPI_CHECK(MPI_Bcast(at(buffer, offset), count, type, root, comm_));
  });
  if (!buffer.is_same(tensor)) tensor.copy_(buffer);
}

torch::Tensor MpiCommunicator::all_gather(const torch::Tensor& input) {
  check_tensor(input, "all_gather");
  if (options_.check_sizes) {
    detail::check_same_collective(comm_, "all_gather", input.numel(), input.scalar_type(), 0, "-");
  }
  const torch::Tensor in = contiguous_buffer(input);
  std::vector<int64_t> shape{size()};
  shape.insert(shape.end(), input.sizes().begin(), input.sizes().end());
  torch::Tensor out = torch::empty(shape, input.options());
  const int64_t n = in.numel();
  const MPI_Datatype type = wire_type(in.scalar_type());
  if (n <= options_.max_chunk_elements) {
    if (n > 0) {
      GPT2P_MPI_CHECK(MPI_Allgather(in.data_ptr(), static_cast<int>(n), type, out.data_ptr(),
                                    static_cast<int>(n), type, comm_));
    }
    return out;
  }
  // Large inputs: gather one chunk of every rank at a time, then scatter it into place.
  torch::Tensor rows = out.view({size(), n});
  for_chunks(n, options_.max_chunk_elements, [&](int64_t offset, int count) {
    torch::Tensor tmp = torch::empty({size(), count}, in.options());
    GPT2P_MPI_CHECK(MPI_Allgather(at(in, offset), count, type, tmp.data_ptr(), count, type, comm_));
    rows.slice(1, offset, offset + count).copy_(tmp);
  });
  return out;
}

WorkPtr MpiCommunicator::all_gather_async(const torch::Tensor& input, torch::Tensor& output) {
  check_tensor(input, "all_gather_async");
  check_gather_output(input, output);
  const torch::Tensor in = contiguous_buffer(input);
  const int64_t n = in.numel();
  const MPI_Datatype type = wire_type(in.scalar_type());
  std::vector<MPI_Request> requests;
  if (n <= options_.max_chunk_elements) {
    if (n > 0) {
      MPI_Request r = MPI_REQUEST_NULL;
      GPT2P_MPI_CHECK(MPI_Iallgather(in.data_ptr(), static_cast<int>(n), type, output.data_ptr(),
                                     static_cast<int>(n), type, comm_, &r));
      requests.push_back(r);
    }
    return std::make_unique<MpiWork>(std::move(requests), [in, output] {});
  }
  // Large inputs: one gather per chunk into its own buffer, put into place when complete.
  std::vector<std::pair<int64_t, torch::Tensor>> parts;
  for_chunks(n, options_.max_chunk_elements, [&](int64_t offset, int count) {
    torch::Tensor tmp = torch::empty({size(), count}, in.options());
    MPI_Request r = MPI_REQUEST_NULL;
    GPT2P_MPI_CHECK(MPI_Iallgather(at(in, offset), count, type, tmp.data_ptr(), count, type, comm_, &r));
    requests.push_back(r);
    parts.emplace_back(offset, tmp);
  });
  auto finish = [in, output, parts = std::move(parts), world = size(), n] {
    torch::Tensor rows = output.view({world, n});
    for (const auto& [offset, tmp] : parts) rows.slice(1, offset, offset + tmp.size(1)).copy_(tmp);
  };
  return std::make_unique<MpiWork>(std::move(requests), std::move(finish));
}

WorkPtr MpiCommunicator::send_async(const torch::Tensor& tensor, int peer, int tag) {
  check_tensor(tensor, "send");
  check_peer(peer, "send");
  check_tag(tag, "send");
  torch::Tensor buffer = contiguous_buffer(tensor);
  const MPI_Datatype type = wire_type(buffer.scalar_type());
  std::vector<MPI_Request> requests;
  for_chunks(buffer.numel(), options_.max_chunk_elements, [&](int64_t offset, int count) {
    MPI_Request r = MPI_REQUEST_NULL;
    GPT2P_MPI_CHECK(MPI_Isend(at(buffer, offset), count, type, peer, tag, comm_, &r));
    requests.push_back(r);
  });
  return std::make_unique<MpiWork>(std::move(requests), [buffer] {});
}

WorkPtr MpiCommunicator::recv_async(torch::Tensor& tensor, int peer, int tag) {
  check_tensor(tensor, "recv");
  check_peer(peer, "recv");
  check_tag(tag, "recv");
  torch::Tensor buffer = contiguous_buffer(tensor);
  const MPI_Datatype type = wire_type(buffer.scalar_type());
  std::vector<MPI_Request> requests;
  for_chunks(buffer.numel(), options_.max_chunk_elements, [&](int64_t offset, int count) {
    MPI_Request r = MPI_REQUEST_NULL;
    GPT2P_MPI_CHECK(MPI_Irecv(at(buffer, offset), count, type, peer, tag, comm_, &r));
    requests.push_back(r);
  });
  return std::make_unique<MpiWork>(std::move(requests), [tensor, buffer]() mutable {
    if (!buffer.is_same(tensor)) tensor.copy_(buffer);
  });
}

void MpiCommunicator::barrier() { GPT2P_MPI_CHECK(MPI_Barrier(comm_)); }

}  // namespace gpt2p::comm
