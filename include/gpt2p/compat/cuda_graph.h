// CUDA graphs for a training step: the step's kernels captured once, then launched by one call
// per step (libtorch's at::cuda::CUDAGraph), so the host's launch time stops showing on the GPU.
//
// A captured step replays exactly what was recorded: the same kernels on the same addresses. What
// changes between steps must therefore live in tensors the graph reads (a batch copied into
// static input buffers), and the step may not read the device on the host (.item()), talk to
// other ranks outside the graph, or change shape. The trainers decide when a step qualifies
// (--cuda-graphs); this file only captures and replays.
#pragma once

#include <c10/core/Device.h>

#include <functional>
#include <memory>
#include <string>

namespace gpt2p::compat {

// Whether this build can capture CUDA graphs (a CUDA build; the CPU build has none).
bool cuda_graphs_built();

// For its lifetime, torch's current stream on `device` is a stream of its own instead of the
// default stream (a graph cannot be captured on the default stream). Every operation of the
// thread then runs on it, so nothing crosses streams. Waits for the device at both ends. A no-op
// for the CPU.
class TrainingStream {
 public:
  explicit TrainingStream(const c10::Device& device);
  ~TrainingStream();
  TrainingStream(const TrainingStream&) = delete;
  TrainingStream& operator=(const TrainingStream&) = delete;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A memory pool several graphs share: a tensor one graph leaves alive (a forward's activations,
// kept for its backward) stays where the next graph's capture finds it taken, and memory one
// graph freed is reused by the next. The graphs must then be replayed in the order they were
// captured, every time (a pipeline stage's fixed schedule of forwards and backwards).
class GraphPool {
 public:
  GraphPool();
  ~GraphPool();
  GraphPool(const GraphPool&) = delete;
  GraphPool& operator=(const GraphPool&) = delete;

 private:
  friend class StepGraph;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// One captured piece of device work. capture() runs `body` while the current stream (not the
// default stream: hold a TrainingStream) records it instead of running it; its allocations come
// from the graph's own memory pool and stay valid for replays. Tensors the body reads or writes
// that were made before the capture must outlive the graph. A body that cannot be captured (it
// waits on the device, or calls CUDA in a way capture forbids) fails the capture: capture() throws
// gpt2p::Error with the reason, and the graph stays empty.
class StepGraph {
 public:
  // `pool`: the pool the graph allocates from, shared with other graphs (null: its own).
  explicit StepGraph(const c10::Device& device, std::shared_ptr<GraphPool> pool = nullptr);
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  void capture(const std::function<void()>& body);
  bool captured() const;
  // Queues the captured work on the current stream.
  void replay();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpt2p::compat
