// A communicator without peers, for testing what sits above communication in one process, without
// MPI (c10d's FakeProcessGroup is the example). It is rank `rank` of `size` and every other rank is
// a mirror of this one: each operation completes at once, as if every rank had passed the same
// tensors as this rank.
//
//   all_reduce        sum: size x the tensor; avg: the tensor
//   reduce_scatter    this rank's part of that result
//   all_gather        [size, ...]: the input, size times
//   broadcast         the tensor as it is (the root holds the same)
//   send, barrier     nothing
//   recv              the tensor as it is (nothing arrives)
//
// Argument checks are the real backends' (communicator.h): a test that passes a bad peer, a
// tensor on another device or an unsupported dtype fails as a run would. Every call is counted by
// name ("all_reduce", "all_gather", "send", ...), so a test can check what was communicated.
// With size 1 it is exact: one rank's collectives are exactly these.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "gpt2p/comm/communicator.h"

namespace gpt2p::comm {

class FakeCommunicator final : public Communicator {
 public:
  FakeCommunicator(int rank, int size);

  Backend backend() const override { return Backend::kMpi; }  // host tensors, completed at once
  std::string backend_name() const override { return "fake"; }
  torch::Device device() const override { return torch::kCPU; }

  using Communicator::all_reduce;
  WorkPtr all_reduce_async(torch::Tensor& tensor, ReduceOp op = ReduceOp::kSum) override;
  void broadcast(torch::Tensor& tensor, int root) override;
  torch::Tensor all_gather(const torch::Tensor& input) override;
  WorkPtr reduce_scatter_async(const torch::Tensor& input, torch::Tensor& output,
                               ReduceOp op = ReduceOp::kSum) override;
  WorkPtr send_async(const torch::Tensor& tensor, int peer, int tag = 0) override;
  WorkPtr recv_async(torch::Tensor& tensor, int peer, int tag = 0) override;
  void barrier() override;

  // Calls so far, by operation name (blocking and async forms count under one name).
  int calls(const std::string& op) const;

 private:
  std::map<std::string, int> calls_;
};

}  // namespace gpt2p::comm
