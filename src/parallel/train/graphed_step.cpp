#include "gpt2p/parallel/train/graphed_step.h"

#include <cstdio>
#include <utility>

#include "gpt2p/parallel/train/options.h"

namespace gpt2p::parallel {

std::string graph_blocker(const TrainConfig& cfg, const torch::Device& device) {
  return pipeline::graph_blocker(graph_terms(cfg, device));
}

pipeline::GraphTerms graph_terms(const TrainConfig& cfg, const torch::Device& device) {
  pipeline::GraphTerms terms;
  terms.requested = cfg.compute.cuda_graphs != CudaGraphs::kOff;
  terms.gpu = device.is_cuda();
  terms.every_position = cfg.compute.loss_positions == model::LossPositions::kAll;
  terms.recompute = cfg.compute.recompute != model::Recompute::kNone;
  return terms;
}

GraphedStep::GraphedStep(const torch::Device& device, std::string blocker, bool announce)
    : device_(device), blocker_(std::move(blocker)), announce_(announce) {
  if (blocker_.empty() && !device.is_cuda()) blocker_ = "the device is not a GPU";
  if (blocker_.empty() && !compat::cuda_graphs_built()) blocker_ = "this build has no CUDA";
  if (enabled()) stream_.emplace(device);
}

GraphedStep::~GraphedStep() = default;

std::string GraphedStep::describe() const { return enabled() ? "on" : "off (" + blocker_ + ")"; }

bool GraphedStep::same_shapes(const Tensors& inputs) const {
  if (inputs.size() != static_inputs_.size()) return false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].sizes() != static_inputs_[i].sizes() ||
        inputs[i].scalar_type() != static_inputs_[i].scalar_type()) {
      return false;
    }
  }
  return true;
}

GraphedStep::Tensors GraphedStep::run(const Tensors& inputs,
                                      const std::function<Tensors(const Tensors&)>& body,
                                      const std::function<bool()>& capturable,
                                      const std::function<void()>& after_replay) {
  ++steps_;
  if (!enabled() || steps_ <= kWarmupSteps) return body(inputs);
  if (!graph_) {
    if (!capturable()) {
      blocker_ = "the optimizer step did not take AdamW's fused path";
      if (announce_) {
        std::printf("CUDA graphs off from step %lld: %s\n", static_cast<long long>(steps_),
                    blocker_.c_str());
        std::fflush(stdout);
      }
      return body(inputs);
    }
    static_inputs_.clear();
    for (const auto& t : inputs) static_inputs_.push_back(t.clone());
    auto graph = std::make_unique<compat::StepGraph>(device_);
    graph->capture([&] { static_outputs_ = body(static_inputs_); });
    graph_ = std::move(graph);
    // The capture ran the step's host part (it counted as this step): the replay runs the rest.
    graph_->replay();
    ++replays_;
    return static_outputs_;
  }
  if (!same_shapes(inputs)) {
    ++eager_after_capture_;
    return body(inputs);
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    static_inputs_[i].copy_(inputs[i], /*non_blocking=*/true);
  }
  graph_->replay();
  after_replay();
  ++replays_;
  return static_outputs_;
}

}  // namespace gpt2p::parallel
