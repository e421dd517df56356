// Device-related differences between libtorch versions, and the CUDA calls that only CUDA builds
// make.
#include "gpt2p/compat/device.h"

#include <ATen/autocast_mode.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "gpt2p/compat/version.h"
#include "gpt2p/core/error.h"

#ifdef GPT2P_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>
#endif

namespace gpt2p::compat {

void set_strict_fp32(bool strict) {
  at::globalContext().setAllowTF32CuBLAS(!strict);
  at::globalContext().setAllowTF32CuDNN(!strict);
}

AutocastGuard::AutocastGuard(const torch::Device& device, torch::ScalarType dtype)
    : device_(device), enabled_(dtype == torch::kBFloat16 || dtype == torch::kHalf) {
  if (!enabled_) return;
#if GPT2P_TORCH_AT_LEAST(2, 4)
  previous_ = at::autocast::is_autocast_enabled(device_.type());
  previous_dtype_ = at::autocast::get_autocast_dtype(device_.type());
  at::autocast::set_autocast_dtype(device_.type(), dtype);
  at::autocast::set_autocast_enabled(device_.type(), true);
#else
  if (device_.is_cuda()) {
    previous_ = at::autocast::is_enabled();
    previous_dtype_ = at::autocast::get_autocast_gpu_dtype();
    at::autocast::set_autocast_gpu_dtype(dtype);
    at::autocast::set_enabled(true);
  } else {
    previous_ = at::autocast::is_cpu_enabled();
    previous_dtype_ = at::autocast::get_autocast_cpu_dtype();
    at::autocast::set_autocast_cpu_dtype(dtype);
    at::autocast::set_cpu_enabled(true);
  }
#endif
  at::autocast::increment_nesting();
}

bool autocast_enabled(const torch::Device& device) {
#if GPT2P_TORCH_AT_LEAST(2, 4)
  return at::autocast::is_autocast_enabled(device.type());
#else
  return device.is_cuda() ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
#endif
}

torch::ScalarType autocast_dtype(const torch::Device& device, torch::ScalarType otherwise) {
  if (!autocast_enabled(device)) return otherwise;
#if GPT2P_TORCH_AT_LEAST(2, 4)
  return at::autocast::get_autocast_dtype(device.type());
#else
  return device.is_cuda() ? at::autocast::get_autocast_gpu_dtype()
                          : at::autocast::get_autocast_cpu_dtype();
#endif
}

AutocastGuard::~AutocastGuard() {
  if (!enabled_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
#if GPT2P_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_enabled(device_.type(), previous_);
  at::autocast::set_autocast_dtype(device_.type(), previous_dtype_);
#else
  if (device_.is_cuda()) {
    at::autocast::set_enabled(previous_);
    at::autocast::set_autocast_gpu_dtype(previous_dtype_);
  } else {
    at::autocast::set_cpu_enabled(previous_);
    at::autocast::set_autocast_cpu_dtype(previous_dtype_);
  }
#endif
}

namespace {
bool cast_once_enabled() {
  const char* env = std::getenv("GPT2P_CAST_ONCE");
  return env == nullptr || std::string(env) != "0";
}
}  // namespace

AutocastCacheScope::AutocastCacheScope() : active_(cast_once_enabled()) {
  if (active_) at::autocast::increment_nesting();
}

AutocastCacheScope::~AutocastCacheScope() {
  if (active_ && at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
}

torch::Tensor cached_cast(const torch::Tensor& weight, torch::ScalarType dtype) {
  if (weight.scalar_type() == dtype) return weight;
  return at::autocast::cached_cast(dtype, weight, weight.device().type());
}

bool cuda_available() {
#ifdef GPT2P_WITH_CUDA
  return torch::cuda::is_available();
#else
  return false;
#endif
}

std::string device_name(const torch::Device& device) {
#ifdef GPT2P_WITH_CUDA
  if (device.is_cuda()) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, device.index()) == cudaSuccess) return prop.name;
  }
#endif
  (void)device;
  return "";
}

int compute_capability(const torch::Device& device) {
#ifdef GPT2P_WITH_CUDA
  if (device.is_cuda()) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, device.index()) == cudaSuccess) {
      return prop.major * 10 + prop.minor;
    }
  }
#endif
  (void)device;
  return 0;
}

std::string device_bus_id(const torch::Device& device) {
#ifdef GPT2P_WITH_CUDA
  if (device.is_cuda()) {
    char id[32] = {};
    if (cudaDeviceGetPCIBusId(id, static_cast<int>(sizeof(id)), device.index()) == cudaSuccess) {
      return id;
    }
  }
#endif
  (void)device;
  return "";
}

std::string gpu_bus_id(int index) {
  return device_bus_id(torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index)));
}

void set_current_device(const torch::Device& device) {
#ifdef GPT2P_WITH_CUDA
  if (device.is_cuda()) c10::cuda::set_device(device.index());
#endif
  (void)device;
}

void synchronize(const torch::Device& device) {
#ifdef GPT2P_WITH_CUDA
  if (device.is_cuda()) at::cuda::getCurrentCUDAStream(device.index()).synchronize();
#endif
  (void)device;
}

int64_t peak_memory_bytes(const torch::Device& device) {
#ifdef GPT2P_WITH_CUDA
  if (device.is_cuda()) {
    // Index 0 of the stat arrays is the aggregate over pool types in every 2.x version.
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    return stats.allocated_bytes[0].peak;
  }
#endif
  (void)device;
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;
}

void reset_peak_memory(const torch::Device& device) {
#ifdef GPT2P_WITH_CUDA
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
#endif
  (void)device;
}

struct DeviceClock::Impl {
  bool cuda = false;
  std::vector<std::chrono::steady_clock::time_point> host;
#ifdef GPT2P_WITH_CUDA
  std::vector<cudaEvent_t> events;
#endif
};

DeviceClock::DeviceClock(const torch::Device& device, int capacity) : impl_(new Impl) {
  impl_->cuda = device.is_cuda();
  impl_->host.resize(static_cast<size_t>(capacity));
#ifdef GPT2P_WITH_CUDA
  if (impl_->cuda) {
    impl_->events.resize(static_cast<size_t>(capacity));
    for (auto& e : impl_->events) {
      GPT2P_CHECK(cudaEventCreate(&e) == cudaSuccess, "cudaEventCreate failed",
                  "check the GPU is usable (nvidia-smi)");
    }
  }
#endif
}

DeviceClock::~DeviceClock() {
#ifdef GPT2P_WITH_CUDA
  if (impl_->cuda) {
    for (auto& e : impl_->events) cudaEventDestroy(e);
  }
#endif
  delete impl_;
}

void DeviceClock::mark(int i) {
  GPT2P_CHECK(i >= 0 && i < static_cast<int>(impl_->host.size()),
              "clock mark " << i << " out of range", "this is a bug");
#ifdef GPT2P_WITH_CUDA
  if (impl_->cuda) {
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    // While a CUDA graph captures the stream (compat/cuda_graph.h) the mark becomes one of the
    // graph's nodes: every replay records the event where the eager step would have.
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    GPT2P_CHECK(cudaStreamIsCapturing(stream, &capture) == cudaSuccess,
                "cudaStreamIsCapturing failed", "check the GPU is usable (nvidia-smi)");
    const cudaError_t rc =
        capture == cudaStreamCaptureStatusActive
            ? cudaEventRecordWithFlags(impl_->events[i], stream, cudaEventRecordExternal)
            : cudaEventRecord(impl_->events[i], stream);
    GPT2P_CHECK(rc == cudaSuccess, "cudaEventRecord failed: " << cudaGetErrorString(rc),
                "check the GPU is usable (nvidia-smi)");
    return;
  }
#endif
  impl_->host[i] = std::chrono::steady_clock::now();
}

double DeviceClock::elapsed(int a, int b) {
#ifdef GPT2P_WITH_CUDA
  if (impl_->cuda) {
    GPT2P_CHECK(cudaEventSynchronize(impl_->events[b]) == cudaSuccess,
                "cudaEventSynchronize failed", "check the GPU is usable (nvidia-smi)");
    float ms = 0;
    GPT2P_CHECK(cudaEventElapsedTime(&ms, impl_->events[a], impl_->events[b]) == cudaSuccess,
                "cudaEventElapsedTime failed", "this is a bug: mark both points first");
    return ms / 1000.0;
  }
#endif
  return std::chrono::duration<double>(impl_->host[b] - impl_->host[a]).count();
}

}  // namespace gpt2p::compat
