#include "gpt2p/pipeline/runtime/stage_graphs.h"

#include <utility>

#include "gpt2p/core/error.h"

namespace gpt2p::pipeline {

StageGraphs::StageGraphs(const torch::Device& device, std::shared_ptr<compat::GraphPool> pool,
                         int n_microbatches)
    : device_(device), pool_(std::move(pool)), micro_(static_cast<size_t>(n_microbatches)) {}

StageGraphs::Mode StageGraphs::begin_step() {
  if (step_graphed_) ++graphed_steps_;
  step_graphed_ = false;
  ++steps_;
  mode_ = steps_ <= kWarmupSteps       ? Mode::kEager
          : steps_ == kWarmupSteps + 1 ? Mode::kCapture
                                       : Mode::kReplay;
  return mode_;
}

StageGraphs::Micro& StageGraphs::micro(int mb) {
  GPT2P_CHECK(mb >= 0 && mb < static_cast<int>(micro_.size()),
              "micro-batch " << mb << " of a stage graphed for " << micro_.size(),
              "this is a bug: the schedule's M must be the stage's");
  return micro_[static_cast<size_t>(mb)];
}

torch::Tensor StageGraphs::forward(int mb, const Tensors& inputs, bool input_grad,
                                   const std::function<torch::Tensor(const Tensors&)>& body) {
  auto& m = micro(mb);
  step_graphed_ = true;
  if (mode_ == Mode::kCapture) {
    GPT2P_CHECK(!m.forward, "micro-batch " << mb << "'s forward is captured twice in one step",
                "this is a bug: each micro-batch runs forward once per step");
    m.inputs.clear();
    for (const auto& t : inputs) m.inputs.push_back(t.detach().clone());
    if (input_grad) m.inputs.front().requires_grad_(true);
    m.forward = std::make_unique<compat::StepGraph>(device_, pool_);
    m.forward->capture([&] { m.output = body(m.inputs); });
    m.forward->replay();
    return m.output;
  }
  GPT2P_CHECK(mode_ == Mode::kReplay && m.forward && m.inputs.size() == inputs.size(),
              "micro-batch " << mb << "'s forward replayed before it was captured",
              "this is a bug: capture every micro-batch in the step after the warm-up");
  {
    torch::NoGradGuard no_grad;  // the static input is a leaf that requires grad
    for (size_t i = 0; i < inputs.size(); ++i) {
      GPT2P_CHECK(inputs[i].sizes() == m.inputs[i].sizes(),
                  "micro-batch " << mb << "'s input " << i << " has shape " << inputs[i].sizes()
                                 << ", captured as " << m.inputs[i].sizes(),
                  "run with --cuda-graphs off, and report the run");
      m.inputs[i].copy_(inputs[i], /*non_blocking=*/true);
    }
  }
  m.forward->replay();
  return m.output;
}

torch::Tensor StageGraphs::backward(int mb, const torch::Tensor& grad) {
  auto& m = micro(mb);
  if (mode_ == Mode::kCapture) {
    GPT2P_CHECK(m.forward && !m.backward,
                "micro-batch " << mb << "'s backward captured out of order",
                "this is a bug: each micro-batch's backward follows its forward once per step");
    if (grad.defined()) m.grad_out = grad.detach().clone();
    m.backward = std::make_unique<compat::StepGraph>(device_, pool_);
    m.backward->capture([&] {
      if (m.grad_out.defined()) {
        torch::autograd::backward({m.output}, {m.grad_out});
      } else {
        m.output.backward();
      }
    });
    m.backward->replay();
    if (m.inputs.front().requires_grad()) m.grad_in = m.inputs.front().grad();
    return m.grad_in;
  }
  GPT2P_CHECK(mode_ == Mode::kReplay && m.backward,
              "micro-batch " << mb << "'s backward replayed before it was captured",
              "this is a bug: capture every micro-batch in the step after the warm-up");
  if (m.grad_out.defined()) m.grad_out.copy_(grad, /*non_blocking=*/true);
  m.backward->replay();
  return m.grad_in;
}

}  // namespace gpt2p::pipeline
