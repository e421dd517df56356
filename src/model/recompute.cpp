#include "gpt2p/model/recompute.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/torch.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>

#include "gpt2p/compat/device.h"
#include "gpt2p/compat/rng.h"
#include "gpt2p/core/error.h"

namespace gpt2p::model {

namespace {

using torch::autograd::Node;
using torch::autograd::SavedVariable;
using torch::autograd::variable_list;

bool requires_grad(const torch::Tensor& t) { return t.defined() && t.requires_grad(); }

bool differentiable(const torch::Tensor& t) {
  return t.defined() && (t.is_floating_point() || t.is_complex());
}

// Where each input's gradient goes: its grad_fn or its AccumulateGrad (none: no gradient).
torch::autograd::edge_list edges_of(const std::vector<torch::Tensor>& inputs) {
  torch::autograd::edge_list edges;
  for (const auto& x : inputs) {
    edges.push_back(x.defined() ? torch::autograd::impl::gradient_edge(x)
                                : torch::autograd::Edge());
  }
  return edges;
}

// What the forward ran under, for the recompute to run under it again.
struct ForwardState {
  torch::Device device;
  std::string rng;             // compat::rng_state(device) just before fn ran
  torch::ScalarType autocast;  // compat::autocast_dtype, kFloat32 when off
};

// Sets the generators of `device` to `replay` while alive, and back to what they were after.
class RngReplay {
 public:
  RngReplay(const torch::Device& device, const std::string& replay)
      : device_(device), current_(compat::rng_state(device)) {
    compat::set_rng_state(device_, replay);
  }
  ~RngReplay() { compat::set_rng_state(device_, current_); }
  RngReplay(const RngReplay&) = delete;
  RngReplay& operator=(const RngReplay&) = delete;

 private:
  torch::Device device_;
  std::string current_;
};

// The backward of one checkpointed() call: its next edges are the inputs', its inputs (autograd's
// sense: the gradients it receives) one per output of fn.
class CheckpointBackward : public Node {
 public:
  CheckpointBackward(CheckpointFn fn, const std::vector<torch::Tensor>& inputs, ForwardState state)
      : Node(edges_of(inputs)), fn_(std::move(fn)), state_(std::move(state)) {
    saved_.reserve(inputs.size());
    for (const auto& x : inputs) {
      saved_.emplace_back(x, /*is_output=*/false);
      input_requires_grad_.push_back(requires_grad(x));
    }
  }

  std::string name() const override { return kCheckpointNode; }

  void release_variables() override {
    for (auto& s : saved_) s.reset_data();
    fn_ = nullptr;  // drops what fn holds (a block) with the inputs
    released_ = true;
  }

 protected:
  variable_list apply(variable_list&& grads) override {
    GPT2P_CHECK(!released_,
                "backward through a recomputed part of the model a second time, after the first "
                "backward freed its saved inputs",
                "pass retain_graph = true to the first backward");
    std::vector<torch::Tensor> inputs;
    inputs.reserve(saved_.size());
    for (size_t i = 0; i < saved_.size(); ++i) {
      auto x = saved_[i].unpack();  // checks that nothing modified the input in place
      if (x.defined()) x = x.detach().requires_grad_(input_requires_grad_[i]);
      inputs.push_back(std::move(x));
    }
    std::vector<torch::Tensor> outputs;
    {
      RngReplay rng(state_.device, state_.rng);
      torch::AutoGradMode grad_mode(true);
      compat::AutocastGuard autocast(state_.device, state_.autocast);
      outputs = fn_(inputs);
    }
    GPT2P_CHECK(
        outputs.size() == grads.size(),
        "the recompute returned " << outputs.size() << " tensors, the forward " << grads.size(),
        "a checkpointed function must compute the same thing every time it is called");
    variable_list roots, root_grads;
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (grads[i].defined() && requires_grad(outputs[i])) {
        roots.push_back(outputs[i]);
        root_grads.push_back(grads[i]);
      }
    }
    if (!roots.empty()) torch::autograd::backward(roots, root_grads);
    variable_list input_grads;
    input_grads.reserve(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      input_grads.push_back(input_requires_grad_[i] ? inputs[i].grad() : torch::Tensor());
    }
    return input_grads;
  }

 private:
  CheckpointFn fn_;
  ForwardState state_;
  std::vector<SavedVariable> saved_;
  std::vector<bool> input_requires_grad_;
  bool released_ = false;
};

}  // namespace

std::vector<torch::Tensor> checkpointed(const CheckpointFn& fn,
                                        const std::vector<torch::Tensor>& inputs,
                                        const std::vector<torch::Tensor>& params) {
  const bool record =
      torch::GradMode::is_enabled() && (std::any_of(inputs.begin(), inputs.end(), requires_grad) ||
                                        std::any_of(params.begin(), params.end(), requires_grad));
  if (!record) return fn(inputs);

  const auto first = std::find_if(inputs.begin(), inputs.end(),
                                  [](const torch::Tensor& t) { return t.defined(); });
  const torch::Device device = first != inputs.end() ? first->device() : torch::Device(torch::kCPU);
  ForwardState state{device, compat::rng_state(device),
                     compat::autocast_dtype(device, torch::kFloat32)};
  std::vector<torch::Tensor> outputs;
  {
    torch::NoGradGuard no_grad;
    outputs = fn(inputs);
  }
  std::shared_ptr<CheckpointBackward> node(new CheckpointBackward(fn, inputs, std::move(state)),
                                           torch::autograd::deleteNode);
  for (auto& out : outputs) {
    if (!differentiable(out)) {
      node->add_input_metadata(Node::undefined_input());  // receives no gradient
      continue;
    }
    // A tensor of its own: fn may return an input, or a view, whose history is not this node's.
    out = out.detach();
    torch::autograd::create_gradient_edge(out, node);
  }
  return outputs;
}

}  // namespace gpt2p::model
