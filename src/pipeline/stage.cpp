#include "gpt2p/pipeline/stage.h"

#include <algorithm>
#include <cmath>

#include "gpt2p/core/compat.h"
#include "gpt2p/core/error.h"
#include "gpt2p/parallel/grad_norm.h"

namespace gpt2p::pipeline {

void Stage::backward_weight(int mb) {
  GPT2P_FAIL("this stage computes its weight gradients in backward; the schedule has a W action "
                 << "for micro-batch " << mb,
             "run W actions only on stages built with split_backward");
}

GptStage::GptStage(model::GPT2 model, int n_microbatches, bool bf16,
                   model::LossPositions positions, bool split_backward)
    : model_(std::move(model)), n_microbatches_(n_microbatches), bf16_(bf16),
      positions_(positions) {
  GPT2P_CHECK(n_microbatches_ >= 1,
              "a stage needs at least one micro-batch, got " << n_microbatches_,
              "pass --microbatches >= 1");
  if (split_backward) {
    weight_grads_ = std::make_shared<model::WeightGradStore>();
    model_->set_weight_grad_store(weight_grads_);
  }
}

void GptStage::set_batch(StageBatch batch) {
  const int64_t rows = batch.inputs.size(0);
  GPT2P_CHECK(
      rows % n_microbatches_ == 0,
      "batch of " << rows << " rows does not split into " << n_microbatches_ << " micro-batches",
      "pick --microbatches dividing --batch-size");
  micro_rows_ = rows / n_microbatches_;
  batch_ = std::move(batch);
  if (is_last()) {
    const double scale = 1.0 / static_cast<double>(std::max<int64_t>(1, batch_.global_target_tokens));
    loss_rows_ = model::loss_rows(batch_.labels,
                                  batch_.host_mask.defined() ? batch_.host_mask : batch_.mask,
                                  n_microbatches_, scale, positions_);
  }
}

double GptStage::take_loss() {
  if (!loss_sum_.defined()) return 0.0;
  const double v = loss_sum_.item<double>();
  loss_sum_ = torch::Tensor();
  return v;
}

int GptStage::check_microbatch(int mb) const {
  GPT2P_CHECK(
      batch_.inputs.defined() && mb >= 0 && mb < n_microbatches_,
      "micro-batch " << mb << " requested but the stage has " << n_microbatches_ << " micro-batches"
                     << (batch_.inputs.defined() ? "" : " and no batch"),
      "call set_batch() before running a step and keep the schedule's M equal to the stage's");
  return mb;
}

torch::Tensor GptStage::rows(const torch::Tensor& t, int mb) const {
  return t.narrow(0, check_microbatch(mb) * micro_rows_, micro_rows_);
}

torch::Tensor GptStage::input(int mb) { return rows(batch_.inputs, mb); }

torch::Tensor GptStage::empty_activation(int mb) {
  const auto ids = rows(batch_.inputs, mb);
  return torch::empty({ids.size(0), ids.size(1), model_->config().n_embd},
                      torch::TensorOptions().dtype(torch::kFloat32).device(ids.device()));
}

torch::Tensor GptStage::forward(int mb, const torch::Tensor& input) {
  const torch::Device device = input.device();
  compat::AutocastGuard autocast(device, bf16_);
  if (!is_last()) return model_->forward(input).to(torch::kFloat32);  // activations travel in fp32
  auto loss = model_->loss(input, loss_rows_[static_cast<size_t>(check_microbatch(mb))], bf16_);
  loss_sum_ = loss_sum_.defined() ? loss_sum_ + loss.detach() : loss.detach();
  return loss;
}

void GptStage::backward(int mb, const torch::Tensor& output, const torch::Tensor& grad) {
  if (!grad.defined()) {
    output.backward();
  } else {
    torch::autograd::backward({output}, {grad});
  }
  if (weight_grads_) weight_grads_->close(check_microbatch(mb));
}

void GptStage::backward_weight(int mb) {
  GPT2P_CHECK(weight_grads_ != nullptr,
              "W action for micro-batch " << mb << " on a stage that does not split its backward",
              "build the stage with split_backward (pp_train --zero-bubble)");
  weight_grads_->run(check_microbatch(mb));
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

}  // namespace gpt2p::pipeline
