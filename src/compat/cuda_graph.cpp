#include "gpt2p/compat/cuda_graph.h"

#include <exception>
#include <optional>
#include <string>
#include <utility>

#include "gpt2p/core/error.h"

#ifdef GPT2P_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace gpt2p::compat {

#ifdef GPT2P_WITH_CUDA

bool cuda_graphs_built() { return true; }

namespace {
c10::DeviceIndex index_of(const c10::Device& device) {
  return device.index() < 0 ? c10::cuda::current_device() : device.index();
}
}  // namespace

struct TrainingStream::Impl {
  std::optional<c10::cuda::CUDAStream> previous, own;
};

TrainingStream::TrainingStream(const c10::Device& device) : impl_(std::make_unique<Impl>()) {
  if (!device.is_cuda()) return;
  const auto index = index_of(device);
  // What was queued on the default stream (the parameters' initialisation, a checkpoint's load)
  // is done before the own stream runs anything.
  c10::cuda::device_synchronize();
  impl_->previous = c10::cuda::getCurrentCUDAStream(index);
  impl_->own = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, index);
  c10::cuda::setCurrentCUDAStream(*impl_->own);
}

TrainingStream::~TrainingStream() {
  if (!impl_->own) return;
  // No throw from a destructor: a failed synchronisation shows at the next CUDA call.
  (void)cudaStreamSynchronize(impl_->own->stream());
  c10::cuda::setCurrentCUDAStream(*impl_->previous);
}

struct GraphPool::Impl {
  decltype(at::cuda::graph_pool_handle()) id = at::cuda::graph_pool_handle();
};
GraphPool::GraphPool() : impl_(std::make_unique<Impl>()) {}
GraphPool::~GraphPool() = default;

struct StepGraph::Impl {
  c10::Device device;
  std::shared_ptr<GraphPool> pool;
  std::unique_ptr<at::cuda::CUDAGraph> graph;
};

StepGraph::StepGraph(const c10::Device& device, std::shared_ptr<GraphPool> pool)
    : impl_(std::make_unique<Impl>(Impl{device, std::move(pool), {}})) {
  GPT2P_CHECK(device.is_cuda(), "a CUDA graph on " << device.str(),
              "this is a bug: graphs capture CUDA work only");
}

StepGraph::~StepGraph() = default;

bool StepGraph::captured() const { return impl_->graph != nullptr; }

void StepGraph::capture(const std::function<void()>& body) {
  GPT2P_CHECK(!captured(), "the step's CUDA graph is captured twice",
              "this is a bug: capture a StepGraph once");
  const auto index = index_of(impl_->device);
  GPT2P_CHECK(c10::cuda::getCurrentCUDAStream(index) != c10::cuda::getDefaultCUDAStream(index),
              "a CUDA graph capture on the default stream",
              "this is a bug: hold a compat::TrainingStream while capturing");
  auto graph = std::make_unique<at::cuda::CUDAGraph>();
  if (impl_->pool) {
    graph->capture_begin(impl_->pool->impl_->id);
  } else {
    // The blocks the eager steps before left cached would stay reserved beside the graph's pool.
    c10::cuda::device_synchronize();
    c10::cuda::CUDACachingAllocator::emptyCache();
    graph->capture_begin();
  }
  std::string failure;
  try {
    body();
  } catch (const std::exception& e) {
    failure = e.what();
  }
  try {
    graph->capture_end();
  } catch (const std::exception& e) {
    if (failure.empty()) failure = e.what();
  }
  if (!failure.empty()) {
    (void)cudaGetLastError();  // the refused call's error is not the next call's
    GPT2P_FAIL("capturing the training step in a CUDA graph failed: " << failure,
               "run with --cuda-graphs off (the step then launches its kernels one by one), and "
               "report the run");
  }
  impl_->graph = std::move(graph);
}

void StepGraph::replay() {
  GPT2P_CHECK(captured(), "replaying a CUDA graph that was never captured",
              "this is a bug: capture the step first");
  impl_->graph->replay();
}

#else  // a CPU build

bool cuda_graphs_built() { return false; }

struct TrainingStream::Impl {};
TrainingStream::TrainingStream(const c10::Device& /*device*/) {}
TrainingStream::~TrainingStream() = default;

struct GraphPool::Impl {};
GraphPool::GraphPool() = default;
GraphPool::~GraphPool() = default;

struct StepGraph::Impl {};
StepGraph::StepGraph(const c10::Device& device, std::shared_ptr<GraphPool> /*pool*/) {
  GPT2P_FAIL("a CUDA graph on " << device.str() << " in a build without CUDA",
             "this is a bug: check compat::cuda_graphs_built() first");
}
StepGraph::~StepGraph() = default;
bool StepGraph::captured() const { return false; }
void StepGraph::capture(const std::function<void()>& /*body*/) {
  GPT2P_FAIL("a CUDA graph capture in a build without CUDA", "this is a bug");
}
void StepGraph::replay() {
  GPT2P_FAIL("a CUDA graph replay in a build without CUDA", "this is a bug");
}

#endif

}  // namespace gpt2p::compat
