#include "gpt2p/pipeline/runtime/stage.h"

#include <algorithm>
#include <cmath>

#include "gpt2p/compat/device.h"
#include "gpt2p/core/error.h"

namespace gpt2p::pipeline {

void Stage::backward_weight(int mb) {
  GPT2P_FAIL("this stage computes its weight gradients in backward; the schedule has a W action "
                 << "for micro-batch " << mb,
             "run W actions only on stages built with split_backward");
}

GptStageBase::GptStageBase(model::GPT2 model, int n_microbatches, torch::ScalarType autocast)
    : model_(std::move(model)), n_microbatches_(n_microbatches), autocast_(autocast) {
  GPT2P_CHECK(n_microbatches_ >= 1,
              "a stage needs at least one micro-batch, got " << n_microbatches_,
              "pass --microbatches >= 1");
}

void GptStageBase::store_batch(StageBatch batch) {
  const int64_t rows = batch.inputs.size(0);
  GPT2P_CHECK(
      rows % n_microbatches_ == 0,
      "batch of " << rows << " rows does not split into " << n_microbatches_ << " micro-batches",
      "pick --microbatches dividing --batch-size");
  micro_rows_ = rows / n_microbatches_;
  batch_ = std::move(batch);
}

int GptStageBase::check_microbatch(int mb) const {
  GPT2P_CHECK(
      batch_.inputs.defined() && mb >= 0 && mb < n_microbatches_,
      "micro-batch " << mb << " requested but the stage has " << n_microbatches_ << " micro-batches"
                     << (batch_.inputs.defined() ? "" : " and no batch"),
      "call set_batch() before running a step and keep the schedule's M equal to the stage's");
  return mb;
}

torch::Tensor GptStageBase::rows(const torch::Tensor& t, int mb) const {
  return t.narrow(0, check_microbatch(mb) * micro_rows_, micro_rows_);
}

torch::Tensor GptStageBase::input(int mb) { return rows(batch_.inputs, mb); }

torch::Tensor GptStageBase::empty_activation(int mb) {
  const auto ids = rows(batch_.inputs, mb);
  return torch::empty({ids.size(0), ids.size(1), model_->config().n_embd},
                      torch::TensorOptions().dtype(torch::kFloat32).device(ids.device()));
}

GptStage::GptStage(model::GPT2 model, int n_microbatches, torch::ScalarType autocast,
                   model::LossPositions positions, bool split_backward)
    : GptStageBase(std::move(model), n_microbatches, autocast), positions_(positions) {
  if (split_backward) {
    weight_grads_ = std::make_shared<model::WeightGradStore>();
    model_->set_weight_grad_store(weight_grads_);
  }
}

void GptStage::use_graphs(std::shared_ptr<compat::GraphPool> pool) {
  GPT2P_CHECK(weight_grads_ == nullptr, "CUDA graphs on a stage that splits its backward",
              "this is a bug: zero-bubble stages run eagerly");
  const auto params = model_->parameters();
  GPT2P_CHECK(!params.empty() && params.front().is_cuda(), "CUDA graphs on a stage off the GPU",
              "this is a bug: graph only CUDA stages");
  graphs_ =
      std::make_unique<StageGraphs>(params.front().device(), std::move(pool), n_microbatches_);
  // .grad now stays allocated: the micro-batches' weight gradients add into it in their GEMMs.
  model_->set_grad_accumulation(true);
  live_inputs_.assign(static_cast<size_t>(n_microbatches_), torch::Tensor());
}

GptStage::~GptStage() {
  if (lookup_per_step_) model_->set_embedding_grad_sink({});
}

void GptStage::sum_lookup_grads_per_step() {
  // One micro-batch: the plain lookup already makes one dense gradient a step.
  if (!is_first() || n_microbatches_ == 1) return;
  GPT2P_CHECK(!model_->has_embedding_grad_sink(),
              "sum_lookup_grads_per_step() on a model whose token lookup already has a sink",
              "this is a bug: one owner takes the lookup's gradient (data parallelism's sparse "
              "sync or this stage)");
  lookup_per_step_ = true;
  if (batch_.inputs.defined()) size_lookup_grads(batch_.inputs);
  model_->set_embedding_grad_sink([this](const torch::Tensor& ids, const torch::Tensor& grad) {
    GPT2P_CHECK(lookup_grads_.defined() && grad.dim() == 3 && grad.size(0) == micro_rows_ &&
                    grad.size(1) == lookup_grads_.size(1) && grad.size(2) == lookup_grads_.size(2),
                "the token lookup's gradient " << grad.sizes() << " (ids " << ids.sizes()
                                               << ") does not fit micro-batch " << backward_mb_
                                               << "'s rows",
                "this is a bug: run the stage's backward through GptStage::backward");
    lookup_grads_.narrow(0, backward_mb_ * micro_rows_, micro_rows_).copy_(grad);
    ++lookup_calls_;
  });
}

void GptStage::size_lookup_grads(const torch::Tensor& ids) {
  // Outside any capture: the graphed backwards write into this buffer at every replay, and a
  // replay runs only on the shapes it captured.
  if (!lookup_grads_.defined() || lookup_grads_.size(0) != ids.size(0) ||
      lookup_grads_.size(1) != ids.size(1)) {
    lookup_grads_ = torch::empty({ids.size(0), ids.size(1), model_->config().n_embd},
                                 model_->wte->weight.options());
  }
}

void GptStage::add_lookup_grads() {
  // Replays copy into the buffer without the host seeing it; eager and captured backwards must
  // each have filled their rows, or the buffer holds another step's (or no) gradients.
  const bool replayed = graphs_ && graphs_->mode() == StageGraphs::Mode::kReplay;
  GPT2P_CHECK(replayed || lookup_calls_ == n_microbatches_,
              "the token lookup's gradient reached the stage's buffer from "
                  << lookup_calls_ << " of " << n_microbatches_ << " micro-batches",
              "this is a bug: keep one embedding gradient sink per model");
  torch::NoGradGuard no_grad;
  const auto& weight = model_->wte->weight;
  const auto part = at::embedding_dense_backward(lookup_grads_.view({-1, lookup_grads_.size(-1)}),
                                                 batch_.inputs.reshape({-1}), weight.size(0),
                                                 /*padding_idx=*/-1, /*scale_grad_by_freq=*/false);
  auto& g = weight.mutable_grad();
  if (g.defined()) {
    g.add_(part);
  } else {
    g = part;
  }
}

void GptStage::set_batch(StageBatch batch) {
  backwards_ = 0;
  lookup_calls_ = 0;
  if (lookup_per_step_) size_lookup_grads(batch.inputs);
  if (graphs_ && graphs_->begin_step() == StageGraphs::Mode::kCapture) {
    // The captured backwards add into .grad: it must exist, where it stays, before them.
    torch::NoGradGuard no_grad;
    for (auto& p : model_->parameters()) {
      if (p.requires_grad() && !p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
    }
  }
  store_batch(std::move(batch));
  if (is_last()) {
    const double scale =
        batch_.loss_scale / static_cast<double>(std::max<int64_t>(1, batch_.global_target_tokens));
    loss_rows_ =
        model::loss_rows(batch_.labels, batch_.host_mask.defined() ? batch_.host_mask : batch_.mask,
                         n_microbatches_, scale, positions_);
  }
}

double GptStage::take_loss() {
  if (!loss_sum_.defined()) return 0.0;
  const double v = loss_sum_.item<double>() / batch_.loss_scale;
  loss_sum_ = torch::Tensor();
  return v;
}

torch::Tensor GptStage::forward(int mb, const torch::Tensor& input) {
  if (graphs_ && graphs_->mode() != StageGraphs::Mode::kEager) {
    StageGraphs::Tensors in{input};
    if (is_last()) {
      const auto& r = loss_rows_[static_cast<size_t>(check_microbatch(mb))];
      in.insert(in.end(), {r.index, r.labels, r.weights});
    }
    live_inputs_[static_cast<size_t>(check_microbatch(mb))] = input;
    auto out = graphs_->forward(mb, in, !is_first(), [&](const StageGraphs::Tensors& s) {
      compat::AutocastGuard autocast(s.front().device(), autocast_);
      if (!is_last()) return model_->forward(s.front()).to(torch::kFloat32);
      return model_->loss(s.front(), model::LossRows{s[1], s[2], s[3]}, autocast_);
    });
    if (is_last())
      loss_sum_ = loss_sum_.defined() ? loss_sum_ + out.detach() : out.detach().clone();
    return out;
  }
  const torch::Device device = input.device();
  compat::AutocastGuard autocast(device, autocast_);
  if (!is_last()) return model_->forward(input).to(torch::kFloat32);  // activations travel in fp32
  auto loss = model_->loss(input, loss_rows_[static_cast<size_t>(check_microbatch(mb))], autocast_);
  loss_sum_ = loss_sum_.defined() ? loss_sum_ + loss.detach() : loss.detach();
  return loss;
}

void GptStage::backward(int mb, const torch::Tensor& output, const torch::Tensor& grad) {
  const bool last = ++backwards_ == n_microbatches_;
  if (last && last_backward_hook_) last_backward_hook_();
  backward_mb_ = check_microbatch(mb);
  if (graphs_ && graphs_->mode() != StageGraphs::Mode::kEager) {
    const auto grad_in = graphs_->backward(mb, grad);
    // The executor sends what it finds on its own input.
    if (!is_first()) live_inputs_[static_cast<size_t>(mb)].mutable_grad() = grad_in;
    live_inputs_[static_cast<size_t>(mb)] = torch::Tensor();
  } else {
    if (!grad.defined()) {
      output.backward();
    } else {
      torch::autograd::backward({output}, {grad});
    }
    if (weight_grads_) weight_grads_->close(mb);
  }
  if (last && lookup_per_step_) add_lookup_grads();
}

void GptStage::backward_weight(int mb) {
  GPT2P_CHECK(weight_grads_ != nullptr,
              "W action for micro-batch " << mb << " on a stage that does not split its backward",
              "build the stage with split_backward (pp_train --zero-bubble)");
  weight_grads_->run(check_microbatch(mb));
}

GptEvalStage::GptEvalStage(model::GPT2 model, int n_microbatches, torch::ScalarType autocast)
    : GptStageBase(std::move(model), n_microbatches, autocast) {}

void GptEvalStage::set_batch(StageBatch batch) { store_batch(std::move(batch)); }

GptEvalStage::Totals GptEvalStage::take_totals() {
  const Totals t = totals_;
  totals_ = Totals();
  return t;
}

torch::Tensor GptEvalStage::forward(int mb, const torch::Tensor& input) {
  torch::Tensor y;
  {
    compat::AutocastGuard autocast(input.device(), autocast_);
    y = model_->forward(input).to(torch::kFloat32);  // activations travel in fp32
  }
  if (!is_last()) return y;
  const auto mask = rows(batch_.mask, mb);
  const double tokens = mask.sum().item<double>();
  if (tokens == 0) return y;
  totals_.loss_sum += model_->lm_loss(y, rows(batch_.labels, mb), mask).item<double>() * tokens;
  totals_.tokens += tokens;
  return y;
}

void GptEvalStage::backward(int mb, const torch::Tensor& /*output*/,
                            const torch::Tensor& /*grad*/) {
  GPT2P_FAIL(
      "the evaluation stage runs forward only; the schedule has a B action for micro-batch " << mb,
      "run evaluation with make_forward_only_schedule and Pass::kForwardOnly");
}

}  // namespace gpt2p::pipeline
