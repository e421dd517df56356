#include "mpi_work.h"

#include <exception>

#include "gpt2p/core/error.h"

namespace gpt2p::comm::mpi {

MPI_Datatype wire_type(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat32: return MPI_FLOAT;
    case torch::kFloat64: return MPI_DOUBLE;
    case torch::kInt32: return MPI_INT32_T;
    case torch::kInt64: return MPI_INT64_T;
    case torch::kBFloat16: return MPI_UINT16_T;
    default:
      GPT2P_FAIL("no MPI type for dtype " << dtype_name(t),
                 "this is a bug: check_tensor let it through");
  }
}

MPI_Op mpi_op(ReduceOp) { return MPI_SUM; }

char* at(const torch::Tensor& t, int64_t element) {
  return static_cast<char*>(t.data_ptr()) + element * static_cast<int64_t>(t.element_size());
}

std::string describe_op(const char* op, int peer, int world) {
  std::string s =
      std::string(op) + (peer >= 0 ? (std::string(" with rank ") + std::to_string(peer)) : "");
  return s + " (MPI, " + std::to_string(world) + " ranks)";
}

MpiWork::~MpiWork() {
  if (done_) return;
  // Unwinding after an error (a timeout, most often) ends in MPI_Abort: waiting here for a peer
  // that may never come would only delay it. The requests and their buffers are left alive, so
  // MPI never writes into freed memory.
  if (std::uncaught_exceptions() > 0 || timed_out_) {
    static_cast<void>(new Abandoned{std::move(requests_), std::move(finish_)});  // NOLINT
    return;
  }
  // A Work dropped without wait() must not leave MPI writing into freed memory.
  try {
    wait();
  } catch (...) {  // NOLINT(bugprone-empty-catch): never throw from a destructor
  }
}

void MpiWork::wait() {
  if (done_) return;
  timed_out_ = true;  // until wait_all returns
  wait_all(requests_.data(), static_cast<int>(requests_.size()), place_.timeout,
           [this] { return describe_op(place_.op, place_.peer, place_.world); });
  timed_out_ = false;
  done_ = true;
  if (finish_) finish_();
}

bool MpiWork::is_completed() {
  if (done_) return true;
  int flag = 0;
  GPT2P_MPI_CHECK(MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &flag,
                              MPI_STATUSES_IGNORE));
  if (flag != 0) wait();  // requests are now MPI_REQUEST_NULL: this only runs finish
  return done_;
}

Staged stage_reduce(torch::Tensor& tensor, ReduceOp op, int world, bool host) {
  Staged s;
  bool copy_back = true;
  const auto wire =
      tensor.scalar_type() == torch::kBFloat16 ? torch::kFloat32 : tensor.scalar_type();
  if (host) {
    s.buffer = tensor.to(torch::TensorOptions().device(torch::kCPU).dtype(wire)).contiguous();
  } else if (wire != tensor.scalar_type()) {
    s.buffer = tensor.to(wire).contiguous();
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

}  // namespace gpt2p::comm::mpi
