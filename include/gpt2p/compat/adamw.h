// AdamW with PyTorch's fused kernel where this libtorch and device have it (compat/version.h).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace gpt2p::compat {

// torch::optim::AdamW whose step() runs PyTorch's fused multi-tensor kernel (at::_fused_adamw_,
// what torch.optim.AdamW(fused=True) calls: one launch for all parameters) when this build has
// CUDA, the libtorch has the kernel (2.1+) and every parameter with a gradient is a CUDA tensor of
// one dtype; otherwise the per-parameter step of torch::optim::AdamW. The update is the same
// decoupled-weight-decay AdamW either way, and the state stays torch::optim::AdamW's (exp_avg,
// exp_avg_sq, step), so checkpoints load into either path. GPT2P_FUSED_ADAMW=0 in the environment
// forces the per-parameter path (to compare the two).
class FusedAdamW : public torch::optim::AdamW {
 public:
  FusedAdamW(std::vector<torch::Tensor> params, torch::optim::AdamWOptions options);
  torch::Tensor step(LossClosure closure = nullptr) override;
  // True when the last step() took the fused path.
  bool last_step_fused() const { return fused_; }

  // CUDA graphs (compat/cuda_graph.h). The fused path keeps each parameter's step count twice: on
  // the host (the state a checkpoint saves) and on the device (what the kernel reads), and the
  // device counts are advanced by a kernel, so a captured step advances them on every replay. A
  // replay does not run the host's side: after each replay of a graph that captured the last
  // fused step(), count_replayed_step() advances the host counts of the parameters that step
  // updated, as it did.
  void count_replayed_step();

 private:
  bool fused_step();
  // Per parameter: the step count as a device tensor (the kernel's form), and the host count it
  // was made from (a checkpoint load changes the host count).
  std::vector<torch::Tensor> device_steps_;
  std::vector<int64_t> synced_steps_;
  // The parameters the last fused step updated, and their slots in the two vectors above.
  std::vector<torch::Tensor> stepped_;
  std::vector<size_t> stepped_slots_;
  bool fused_ = false;
};

// torch::optim::AdamW's state of parameter `p` in `optimizer` (keyed differently across libtorch
// versions), or null when it has none yet (no step taken).
const torch::optim::AdamWParamState* adamw_state(const torch::optim::Optimizer& optimizer,
                                                 const torch::Tensor& p);
// Sets it (replacing any): the step count and the two moments, which must have p's shape.
void set_adamw_state(torch::optim::Optimizer& optimizer, const torch::Tensor& p, int64_t step,
                     torch::Tensor exp_avg, torch::Tensor exp_avg_sq);

}  // namespace gpt2p::compat
