#include "gpt2p/parallel/data_parallel/replica_grad_sync.h"

#include <cmath>

#include "gpt2p/core/error.h"
#include "gpt2p/parallel/data_parallel/grad_norm.h"

namespace gpt2p::parallel {

ReplicaGradSync::ReplicaGradSync(const std::vector<torch::Tensor>& params,
                                 comm::Communicator& replicas, double bucket_mb)
    : replicas_(replicas) {
  BucketOptions o;
  o.bucket_mb = bucket_mb;
  o.dtype = torch::kFloat32;
  buckets_ = std::make_unique<GradBuckets>(params, o, [this](size_t b) {
    works_[b] = replicas_.all_reduce_async(buckets_->flat(b), comm::ReduceOp::kSum);
  });
  works_.resize(buckets_->buckets().size());
}

void ReplicaGradSync::begin_backward(bool sync) {
  if (sync) buckets_->arm(true);
}

void ReplicaGradSync::end_backward() {
  auto& buckets = *buckets_;
  // A stage whose last backward never came (no micro-batch reached it) is filled whole.
  if (!buckets.armed()) buckets.arm(true);
  buckets.finish_backward();
  for (size_t b = 0; b < works_.size(); ++b) {
    works_[b]->wait();
    works_[b].reset();
    for (size_t s : buckets.buckets()[b].slots) {
      auto& param = buckets.slots()[s].param;
      auto& g = param.mutable_grad();
      const auto sum = buckets.view(buckets.flat(b), s);
      if (g.defined()) {
        g.copy_(sum);
      } else {
        g = sum.clone();
      }
    }
  }
}

void sync_tied_gradient(const std::vector<model::GPT2>& stages, comm::Communicator& comm) {
  if (comm.size() == 1) return;
  std::vector<torch::Tensor> parts;
  for (const auto& m : stages) {
    auto w = m->tied_parameter();
    if (!w.defined() || (!m->has_embedding() && !m->has_head())) {
      parts.emplace_back();
      continue;
    }
    GPT2P_CHECK(w.grad().defined(),
                "stage on rank " << comm.rank() << " has no gradient for the tied wte weight",
                "run the step's backward before sync_tied_gradient()");
    parts.push_back(w.mutable_grad());
  }
  sync_tied_gradient(stages, comm, parts);
}

void sync_tied_gradient(const std::vector<model::GPT2>& stages, comm::Communicator& comm,
                        const std::vector<torch::Tensor>& parts) {
  const int n = comm.size();
  if (n == 1) return;
  const model::GPT2Impl* holder = nullptr;  // this rank's stage with the embedding or the head
  torch::Tensor mine;
  for (size_t c = 0; c < stages.size(); ++c) {
    const auto& m = stages[c];
    if (!m->has_embedding() && !m->has_head()) continue;
    GPT2P_CHECK(holder == nullptr && !m->is_full(),
                "rank " << comm.rank() << " holds both ends of the model but the pipeline has " << n
                        << " ranks",
                "put the first and the last stage on different ranks");
    holder = m.get();
    mine = parts.at(c);
  }
  if (holder == nullptr) return;
  GPT2P_CHECK(mine.defined(), "stage on rank " << comm.rank() << " has no tied gradient part",
              "this is a bug: pass the part of every stage with the embedding or the head");
  const int peer = holder->has_embedding() ? n - 1 : 0;
  auto other = torch::empty_like(mine);
  // Both directions at once (one NCCL group: each link carries one copy, in parallel).
  std::vector<comm::P2POp> ops{{comm::P2POp::Kind::kSend, mine, peer},
                               {comm::P2POp::Kind::kRecv, other, peer}};
  for (auto& work : comm.batch_isend_irecv(ops)) work->wait();
  mine.add_(other);  // a + b == b + a bit for bit: both copies stay identical
}

double clip_grad_norm_pipeline(const std::vector<model::GPT2>& stages, comm::Communicator* comm,
                               double max_norm, double inv_scale) {
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
  const double norm = std::sqrt(sq.item<double>()) * inv_scale;
  parallel::scale_to_max_norm(grads, norm, max_norm, inv_scale);
  return norm;
}

}  // namespace gpt2p::parallel
