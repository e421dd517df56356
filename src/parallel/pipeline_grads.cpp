#include "gpt2p/parallel/pipeline_grads.h"

#include <cmath>

#include "gpt2p/core/error.h"
#include "gpt2p/parallel/grad_norm.h"

namespace gpt2p::parallel {

void sum_replica_gradients(const std::vector<model::GPT2>& stages, comm::Communicator& replicas,
                           double bucket_mb) {
  if (replicas.size() == 1) return;
  const auto limit = static_cast<int64_t>(bucket_mb * (1 << 20));
  std::vector<torch::Tensor> bucket;
  int64_t bytes = 0;
  const auto flush = [&] {
    if (!bucket.empty()) replicas.all_reduce(bucket, comm::ReduceOp::kSum);
    bucket.clear();
    bytes = 0;
  };
  for (const auto& m : stages) {
    for (auto& p : m->parameters()) {
      if (!p.grad().defined()) continue;
      // One dtype per flattened buffer.
      if (!bucket.empty() && bucket.front().scalar_type() != p.grad().scalar_type()) flush();
      bucket.push_back(p.mutable_grad());
      bytes += p.grad().numel() * static_cast<int64_t>(p.grad().element_size());
      if (bytes >= limit) flush();
    }
  }
  flush();
}

void sync_tied_gradient(const std::vector<model::GPT2>& stages, comm::Communicator& comm) {
  const int n = comm.size();
  if (n == 1) return;
  const model::GPT2Impl* holder = nullptr;  // this rank's stage with the embedding or the head
  for (const auto& m : stages) {
    if (!m->has_embedding() && !m->has_head()) continue;
    GPT2P_CHECK(holder == nullptr && !m->is_full(),
                "rank " << comm.rank() << " holds both ends of the model but the pipeline has " << n
                        << " ranks",
                "put the first and the last stage on different ranks");
    holder = m.get();
  }
  if (holder == nullptr) return;
  auto w = holder->tied_parameter();
  GPT2P_CHECK(w.defined() && w.grad().defined(),
              "stage on rank " << comm.rank() << " has no gradient for the tied wte weight",
              "run the step's backward before sync_tied_gradient()");
  const int peer = holder->has_embedding() ? n - 1 : 0;
  auto mine = w.grad();
  auto other = torch::empty_like(mine);
  // Both directions at once (one NCCL group: each link carries one copy, in parallel).
  std::vector<comm::P2POp> ops{{comm::P2POp::Kind::kSend, mine, peer},
                               {comm::P2POp::Kind::kRecv, other, peer}};
  for (auto& work : comm.batch_isend_irecv(ops)) work->wait();
  w.mutable_grad().add_(other);  // a + b == b + a bit for bit: both copies stay identical
}

double clip_grad_norm_pipeline(const std::vector<model::GPT2>& stages, comm::Communicator* comm,
                               double max_norm) {
  std::vector<torch::Tensor> grads, counted;
  for (const auto& m : stages) {
    const auto tied = m->tied_parameter();
    const bool skip_tied = !m->has_embedding();  // the head's copy: counted on the first stage
    for (auto& p : m->parameters()) {
      if (!p.grad().defined()) continue;
      grads.push_back(p.grad());
      if (!(skip_tied && tied.defined() && p.is_same(tied))) counted.push_back(p.grad());
    }
  }
  const torch::Device device = comm != nullptr ? comm->device() : torch::Device(torch::kCPU);
  torch::Tensor sq = parallel::grad_sq_norm(counted).to(device).reshape({1});
  if (comm != nullptr && comm->size() > 1) comm->all_reduce(sq, comm::ReduceOp::kSum);
  const double norm = std::sqrt(sq.item<double>());
  parallel::scale_to_max_norm(grads, norm, max_norm);
  return norm;
}

}  // namespace gpt2p::parallel
