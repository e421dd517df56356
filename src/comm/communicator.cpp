#include "gpt2p/comm/communicator.h"

#include <algorithm>
#include <sstream>

#include "gpt2p/comm/mpi_communicator.h"
#include "gpt2p/comm/nccl_communicator.h"
#include "gpt2p/core/error.h"

namespace gpt2p::comm {
namespace {

bool supported(torch::ScalarType t) {
  return t == torch::kFloat32 || t == torch::kFloat64 || t == torch::kInt32 || t == torch::kInt64 ||
         t == torch::kBFloat16;
}

constexpr const char* kSupported = "float32, float64, int32, int64, bfloat16";

std::string shape_of(const torch::Tensor& t) {
  std::ostringstream os;
  os << t.sizes();
  return os.str();
}

}  // namespace

std::string dtype_name(torch::ScalarType type) {
  switch (type) {
    case torch::kFloat32: return "float32";
    case torch::kFloat64: return "float64";
    case torch::kFloat16: return "float16";
    case torch::kBFloat16: return "bfloat16";
    case torch::kInt8: return "int8";
    case torch::kUInt8: return "uint8";
    case torch::kInt16: return "int16";
    case torch::kInt32: return "int32";
    case torch::kInt64: return "int64";
    case torch::kBool: return "bool";
    default: return c10::toString(type);
  }
}

std::vector<WorkPtr> Communicator::batch_isend_irecv(std::vector<P2POp>& ops) {
  std::vector<WorkPtr> works;
  works.reserve(ops.size());
  for (auto& op : ops) {
    works.push_back(op.kind == P2POp::Kind::kSend ? send_async(op.tensor, op.peer, op.tag)
                                                  : recv_async(op.tensor, op.peer, op.tag));
  }
  return works;
}

const char* reduce_op_name(ReduceOp op) { return op == ReduceOp::kSum ? "sum" : "avg"; }

bool nccl_available() {
#ifdef GPT2P_WITH_CUDA
  return true;
#else
  return false;
#endif
}

void Communicator::check_peer(int peer, const char* op) const {
  GPT2P_CHECK(peer >= 0 && peer < size(),
              op << ": invalid peer rank " << peer << " (communicator has " << size()
                 << " ranks: 0.." << size() - 1 << ")",
              "pass a peer rank in [0, " << size() << ")");
  GPT2P_CHECK(peer != rank(), op << ": peer rank " << peer << " is this rank itself",
              "send to / receive from another rank; copy the tensor locally instead");
}

void Communicator::check_tensor(const torch::Tensor& t, const char* op) const {
  GPT2P_CHECK(t.defined(), op << ": the tensor is undefined",
              "pass an allocated tensor (e.g. torch::empty(shape, options))");
  GPT2P_CHECK(supported(t.scalar_type()),
              op << ": unsupported dtype " << dtype_name(t.scalar_type()) << " (tensor of shape "
                 << shape_of(t) << ")",
              "convert the tensor to one of the supported dtypes: " << kSupported);
  GPT2P_CHECK(t.device() == device(),
              op << ": tensor is on " << t.device() << " but the " << backend_name()
                 << " communicator works on " << device(),
              "move the tensor with .to(comm.device()), or pick the backend that matches it "
              "(mpi: cpu, nccl: cuda)");
}

void Communicator::check_reduce(const torch::Tensor& t, ReduceOp op, const char* what) const {
  GPT2P_CHECK(op != ReduceOp::kAvg || t.is_floating_point(),
              what << ": avg of " << dtype_name(t.scalar_type())
                   << " tensors is not supported (integer division would truncate)",
              "use ReduceOp::kSum and divide yourself, or reduce a floating-point tensor");
}

void Communicator::check_gather_output(const torch::Tensor& input,
                                       const torch::Tensor& output) const {
  std::vector<int64_t> shape{size()};
  shape.insert(shape.end(), input.sizes().begin(), input.sizes().end());
  GPT2P_CHECK(output.defined() && output.sizes() == torch::IntArrayRef(shape) &&
                  output.scalar_type() == input.scalar_type() &&
                  output.device() == input.device() && output.is_contiguous(),
              "all_gather_async: output must be a contiguous "
                  << dtype_name(input.scalar_type()) << " tensor of shape " << shape << " on "
                  << input.device(),
              "allocate it with torch::empty({comm.size(), ...input shape}, input.options())");
}

void Communicator::check_scatter_output(const torch::Tensor& input,
                                        const torch::Tensor& output) const {
  GPT2P_CHECK(output.defined() && output.numel() * size() == input.numel() &&
                  output.scalar_type() == input.scalar_type() &&
                  output.device() == input.device() && output.is_contiguous(),
              "reduce_scatter: output must be a contiguous "
                  << dtype_name(input.scalar_type()) << " tensor of "
                  << input.numel() / std::max(1, size()) << " elements on " << input.device()
                  << " (input: " << input.numel() << " elements over " << size() << " ranks)",
              "pass an input of ranks x n elements and an output of n, e.g. torch::empty({n}, "
              "input.options())");
  if (output.numel() == 0) return;
  const auto* in0 = static_cast<const char*>(input.data_ptr());
  const auto* out0 = static_cast<const char*>(output.data_ptr());
  const auto in_bytes = input.numel() * static_cast<int64_t>(input.element_size());
  const auto out_bytes = output.numel() * static_cast<int64_t>(output.element_size());
  GPT2P_CHECK(out0 + out_bytes <= in0 || in0 + in_bytes <= out0,
              "reduce_scatter: output overlaps input", "give the result its own tensor");
}

namespace {
struct CompletedWork final : Work {
  void wait() override {}
  bool is_completed() override { return true; }
};
}  // namespace

WorkPtr Communicator::all_gather_async(const torch::Tensor& input, torch::Tensor& output) {
  check_gather_output(input, output);
  output.copy_(all_gather(input));
  return std::make_unique<CompletedWork>();
}

void Communicator::reduce_scatter(const torch::Tensor& input, torch::Tensor& output, ReduceOp op) {
  reduce_scatter_async(input, output, op)->wait();
}

WorkPtr Communicator::reduce_scatter_async(const torch::Tensor& input, torch::Tensor& output,
                                           ReduceOp op) {
  check_tensor(input, "reduce_scatter");
  check_reduce(input, op, "reduce_scatter");
  check_scatter_output(input, output);
  torch::Tensor all = input.reshape({-1}).clone();
  all_reduce(all, op);
  output.copy_(all.narrow(0, rank() * output.numel(), output.numel()).view_as(output));
  return std::make_unique<CompletedWork>();
}

void Communicator::all_reduce(torch::Tensor& tensor, ReduceOp op) {
  all_reduce_async(tensor, op)->wait();
}

void Communicator::all_reduce(std::vector<torch::Tensor>& tensors, ReduceOp op) {
  if (tensors.empty()) return;
  const auto dtype = tensors.front().scalar_type();
  std::vector<torch::Tensor> flat;
  flat.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    check_tensor(tensors[i], "all_reduce(list)");
    GPT2P_CHECK(tensors[i].scalar_type() == dtype,
                "all_reduce(list): tensor " << i << " is " << dtype_name(tensors[i].scalar_type())
                                            << " but tensor 0 is " << dtype_name(dtype),
                "reduce tensors of different dtypes in separate calls (one list per dtype)");
    flat.push_back(tensors[i].reshape({-1}));
  }
  torch::Tensor buffer = torch::cat(flat);
  all_reduce(buffer, op);
  int64_t offset = 0;
  for (auto& t : tensors) {
    const int64_t n = t.numel();
    t.copy_(buffer.slice(0, offset, offset + n).view(t.sizes()));
    offset += n;
  }
}

void Communicator::send(const torch::Tensor& tensor, int peer, int tag) {
  send_async(tensor, peer, tag)->wait();
}

void Communicator::recv(torch::Tensor& tensor, int peer, int tag) {
  recv_async(tensor, peer, tag)->wait();
}

std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm) {
  return std::make_unique<MpiCommunicator>(comm);
}

std::unique_ptr<Communicator> make_communicator(const CommOptions& options, MPI_Comm comm) {
  GPT2P_CHECK(options.backend != Backend::kAuto, "make_communicator: backend auto is not resolved",
              "this is a bug: pick kMpi or kNccl before making the communicator");
  if (options.backend == Backend::kMpi) {
    MpiOptions mpi;
    mpi.check_sizes = options.check_sizes;
    mpi.timeout = options.timeout;
    mpi.device = options.device;
    return std::make_unique<MpiCommunicator>(comm, mpi);
  }
#ifdef GPT2P_WITH_CUDA
  return make_nccl_communicator(comm, options);
#else
  GPT2P_FAIL("the nccl backend is not available: built without CUDA",
             "rebuild against a CUDA libtorch, or use --device cpu (the mpi backend)");
#endif
}

}  // namespace gpt2p::comm
