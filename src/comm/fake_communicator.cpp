#include "gpt2p/comm/fake_communicator.h"

#include <cstdint>
#include <vector>

#include "gpt2p/core/error.h"

namespace gpt2p::comm {
namespace {

struct DoneWork final : Work {
  void wait() override {}
  bool is_completed() override { return true; }
};

Topology fake_topology(int rank, int size) {
  GPT2P_CHECK(size >= 1 && rank >= 0 && rank < size,
              "FakeCommunicator: rank " << rank << " of " << size << " ranks",
              "give a size >= 1 and a rank in [0, size)");
  Topology t;
  t.rank = rank;
  t.size = size;
  t.local_rank = rank;
  t.local_size = size;
  t.host = "fake";
  return t;
}

}  // namespace

FakeCommunicator::FakeCommunicator(int rank, int size) : Communicator(fake_topology(rank, size)) {}

int FakeCommunicator::calls(const std::string& op) const {
  const auto it = calls_.find(op);
  return it == calls_.end() ? 0 : it->second;
}

WorkPtr FakeCommunicator::all_reduce_async(torch::Tensor& tensor, ReduceOp op) {
  ++calls_["all_reduce"];
  check_tensor(tensor, "all_reduce");
  check_reduce(tensor, op, "all_reduce");
  if (op == ReduceOp::kSum && size() > 1) tensor.mul_(size());
  return std::make_unique<DoneWork>();
}

void FakeCommunicator::broadcast(torch::Tensor& tensor, int root) {
  ++calls_["broadcast"];
  check_tensor(tensor, "broadcast");
  GPT2P_CHECK(root >= 0 && root < size(),
              "broadcast: root " << root << " of " << size() << " ranks",
              "pass a root in [0, size)");
}

torch::Tensor FakeCommunicator::all_gather(const torch::Tensor& input) {
  ++calls_["all_gather"];
  check_tensor(input, "all_gather");
  std::vector<int64_t> shape{size()};
  for (const int64_t d : input.sizes()) shape.push_back(d);
  return input.unsqueeze(0).expand(shape).clone();
}

WorkPtr FakeCommunicator::reduce_scatter_async(const torch::Tensor& input, torch::Tensor& output,
                                               ReduceOp op) {
  ++calls_["reduce_scatter"];
  check_tensor(input, "reduce_scatter");
  check_reduce(input, op, "reduce_scatter");
  check_scatter_output(input, output);
  auto part = input.reshape({-1}).narrow(0, rank() * output.numel(), output.numel());
  output.copy_(part.view_as(output));
  if (op == ReduceOp::kSum && size() > 1) output.mul_(size());
  return std::make_unique<DoneWork>();
}

WorkPtr FakeCommunicator::send_async(const torch::Tensor& tensor, int peer, int /*tag*/) {
  ++calls_["send"];
  check_peer(peer, "send");
  check_tensor(tensor, "send");
  return std::make_unique<DoneWork>();
}

WorkPtr FakeCommunicator::recv_async(torch::Tensor& tensor, int peer, int /*tag*/) {
  ++calls_["recv"];
  check_peer(peer, "recv");
  check_tensor(tensor, "recv");
  return std::make_unique<DoneWork>();
}

void FakeCommunicator::barrier() { ++calls_["barrier"]; }

}  // namespace gpt2p::comm
