// A trainer's step as one CUDA graph (--cuda-graphs; compat/cuda_graph.h for the mechanism).
//
// The trainer hands run() the tensors that change from step to step (the batch) and a body that
// queues the step's device work reading only those (and the model and optimizer, whose tensors
// stay put). The first kWarmupSteps steps run eagerly: they create the optimizer's state and fill
// the libraries' caches (cuBLASLt's algorithm choices, cuDNN's attention plans), which a capture
// cannot do. The next step is captured and every later one replays the graph after copying its
// batch into the captured inputs: one launch instead of hundreds. A batch whose shapes differ from
// the captured ones (the last, partial batch of an epoch) runs eagerly, with the same body.
//
// While graphs are on, the training thread's work runs on a stream of its own (a capture cannot
// use the default stream), evaluation and checkpoints included.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gpt2p/compat/cuda_graph.h"
#include "gpt2p/pipeline/runtime/graph_terms.h"

namespace gpt2p::parallel {

struct TrainConfig;

// Why no trainer's step can be captured in this run, or "" when nothing in the flags or the device
// forbids it: --cuda-graphs off, a CPU device or build, --loss-positions targets (the head's rows
// change with every batch), --recompute blocks (it reads the dropout state on the host). Each
// trainer adds its own reasons.
std::string graph_blocker(const TrainConfig& cfg, const torch::Device& device);
// The terms of that answer (pipeline::GraphTerms), for a trainer that adds its own.
pipeline::GraphTerms graph_terms(const TrainConfig& cfg, const torch::Device& device);

class GraphedStep {
 public:
  static constexpr int kWarmupSteps = 2;

  // `blocker`: empty when this run's step can be captured, else why it cannot (the start-up line
  // says it). `announce`: this rank prints a line if the graph is given up later.
  GraphedStep(const torch::Device& device, std::string blocker, bool announce);
  ~GraphedStep();

  bool enabled() const { return blocker_.empty(); }
  // For the start-up line: "on" or "off (<why>)".
  std::string describe() const;

  using Tensors = std::vector<torch::Tensor>;
  // One step: body(inputs), eagerly or as the graph. The body returns the tensors the caller
  // reads after the step (a loss); replayed, they are the graph's own, overwritten by the next
  // replay. `capturable`: asked before the capture (the optimizer took its fused path).
  // `after_replay`: the host's part of the step that a replay skips (AdamW's step counts).
  Tensors run(const Tensors& inputs, const std::function<Tensors(const Tensors&)>& body,
              const std::function<bool()>& capturable, const std::function<void()>& after_replay);

  // Steps replayed, and steps run eagerly after the capture (shapes that differed).
  int64_t replays() const { return replays_; }
  int64_t eager_after_capture() const { return eager_after_capture_; }

 private:
  bool same_shapes(const Tensors& inputs) const;

  torch::Device device_;
  std::string blocker_;
  bool announce_;
  std::optional<compat::TrainingStream> stream_;
  std::unique_ptr<compat::StepGraph> graph_;
  Tensors static_inputs_, static_outputs_;
  int64_t steps_ = 0, replays_ = 0, eager_after_capture_ = 0;
};

}  // namespace gpt2p::parallel
