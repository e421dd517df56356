// CUDA graphs of a pipeline stage's forward and backward, one pair per micro-batch (--cuda-graphs).
//
// A pipeline stage runs many small forwards and backwards per step, and at M micro-batches the
// host launches M times the kernels of one whole-batch pass: with small micro-batches the GPU waits
// for it. Here each micro-batch's forward and backward is captured once as a graph and replayed
// as one launch. The schedule stays the executor's: communication, waits and timing run between
// the graphs as before; only the compute inside F and B is replayed.
//
// How (the way torch.cuda.make_graphed_callables does it, with the schedule's order):
//   - Steps 1 .. kWarmupSteps run eagerly (they fill the libraries' caches).
//   - In the next step each F and B is captured when the schedule reaches it and replayed at once.
//     All graphs of a rank share one memory pool (compat::GraphPool), captured in the order the
//     schedule runs them; every later step replays them in that same order, which a pipeline's
//     fixed schedule guarantees.
//   - A forward reads static copies of its inputs (the activation received, or the token ids; on
//     the last stage also the loss rows) and leaves its output in a static tensor; its backward
//     reads a static copy of the incoming gradient, leaves the input's gradient in a static
//     tensor, and adds the parameters' gradients into their .grad in place (the first stage's
//     token lookup into its micro-batch's rows of a buffer, which the stage adds to wte's .grad
//     after the step's last backward: GptStage::sum_lookup_grads_per_step). The trainer must
//     therefore keep .grad allocated, zeroing it in place between steps.
//   - Nothing is ever captured into the pool again after that step: memory some graph left free
//     at the end of the capture step (the weights' bf16 copies of autocast's cache, read by every
//     micro-batch's forward) is still used by the replays, and a later capture would be handed
//     it. A different schedule or shape needs new stages with a pool of their own.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "gpt2p/compat/cuda_graph.h"

namespace gpt2p::pipeline {

class StageGraphs {
 public:
  static constexpr int kWarmupSteps = 2;

  StageGraphs(const torch::Device& device, std::shared_ptr<compat::GraphPool> pool,
              int n_microbatches);

  enum class Mode { kEager, kCapture, kReplay };
  // At the start of a step: which way this step runs.
  Mode begin_step();
  Mode mode() const { return mode_; }
  // Steps whose forwards ran as graphs (captured or replayed), the current one included.
  int64_t graphed_steps() const { return graphed_steps_ + (step_graphed_ ? 1 : 0); }

  using Tensors = std::vector<torch::Tensor>;
  // Forward of micro-batch `mb` (kCapture or kReplay): copies `inputs` into the graph's static
  // inputs -- the first made a leaf that requires grad when `input_grad` -- and returns the static
  // output of body(static inputs). The output stays valid until the same micro-batch's next
  // forward.
  torch::Tensor forward(int mb, const Tensors& inputs, bool input_grad,
                        const std::function<torch::Tensor(const Tensors&)>& body);
  // Backward of `mb` after its forward: `grad` the output's gradient (undefined: the output is the
  // loss). Returns the first input's gradient (undefined unless `input_grad`), valid until the
  // same micro-batch's next backward.
  torch::Tensor backward(int mb, const torch::Tensor& grad);

 private:
  struct Micro {
    std::unique_ptr<compat::StepGraph> forward, backward;
    Tensors inputs;
    torch::Tensor output, grad_out, grad_in;
  };
  Micro& micro(int mb);

  torch::Device device_;
  std::shared_ptr<compat::GraphPool> pool_;
  std::vector<Micro> micro_;
  Mode mode_ = Mode::kEager;
  int steps_ = 0;
  int64_t graphed_steps_ = 0;
  bool step_graphed_ = false;
};

}  // namespace gpt2p::pipeline
