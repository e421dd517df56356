// Device-related differences between libtorch versions, and the CUDA calls that only CUDA builds make.
#include <ATen/autocast_mode.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdlib>
#include <sstream>
#include <type_traits>
#include <vector>

#include "gpt2p/core/compat.h"
#include "gpt2p/core/error.h"

#ifdef GPT2P_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>
#endif

namespace gpt2p::compat {

AutocastGuard::AutocastGuard(const torch::Device& device, bool enabled)
    : device_(device), enabled_(enabled) {
  if (!enabled_) return;
#if GPT2P_TORCH_AT_LEAST(2, 4)
  previous_ = at::autocast::is_autocast_enabled(device_.type());
  at::autocast::set_autocast_dtype(device_.type(), at::kBFloat16);
  at::autocast::set_autocast_enabled(device_.type(), true);
#else
  if (device_.is_cuda()) {
    previous_ = at::autocast::is_enabled();
    at::autocast::set_autocast_gpu_dtype(at::kBFloat16);
    at::autocast::set_enabled(true);
  } else {
    previous_ = at::autocast::is_cpu_enabled();
    at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
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

AutocastGuard::~AutocastGuard() {
  if (!enabled_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
#if GPT2P_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_enabled(device_.type(), previous_);
#else
  if (device_.is_cuda()) {
    at::autocast::set_enabled(previous_);
  } else {
    at::autocast::set_cpu_enabled(previous_);
  }
#endif
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
  GPT2P_CHECK(i >= 0 && i < static_cast<int>(impl_->host.size()), "clock mark " << i << " out of range", "this is a bug");
#ifdef GPT2P_WITH_CUDA
  if (impl_->cuda) {
    GPT2P_CHECK(cudaEventRecord(impl_->events[i], at::cuda::getCurrentCUDAStream()) == cudaSuccess,
                "cudaEventRecord failed", "check the GPU is usable (nvidia-smi)");
    return;
  }
#endif
  impl_->host[i] = std::chrono::steady_clock::now();
}

double DeviceClock::elapsed(int a, int b) {
#ifdef GPT2P_WITH_CUDA
  if (impl_->cuda) {
    GPT2P_CHECK(cudaEventSynchronize(impl_->events[b]) == cudaSuccess, "cudaEventSynchronize failed",
                "check the GPU is usable (nvidia-smi)");
    float ms = 0;
    GPT2P_CHECK(cudaEventElapsedTime(&ms, impl_->events[a], impl_->events[b]) == cudaSuccess,
                "cudaEventElapsedTime failed", "this is a bug: mark both points first");
    return ms / 1000.0;
  }
#endif
  return std::chrono::duration<double>(impl_->host[b] - impl_->host[a]).count();
}

// ---- FusedAdamW ----

namespace {
// The optimizer state map's key for a parameter: its TensorImpl pointer, or (libtorch < 2.1) that
// pointer as text.
template <class Key>
Key state_key(const torch::Tensor& p) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream os;
    os << p.unsafeGetTensorImpl();
    return os.str();
  } else {
    return p.unsafeGetTensorImpl();
  }
}
}  // namespace

FusedAdamW::FusedAdamW(std::vector<torch::Tensor> params, torch::optim::AdamWOptions options)
    : torch::optim::AdamW(std::move(params), std::move(options)) {}

torch::Tensor FusedAdamW::step(LossClosure closure) {
  torch::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  static const bool enabled = [] {
    const char* env = std::getenv("GPT2P_FUSED_ADAMW");
    return env == nullptr || std::string(env) != "0";
  }();
  fused_ = enabled && fused_step();
  if (!fused_) torch::optim::AdamW::step();
  return loss;
}

bool FusedAdamW::fused_step() {
#if defined(GPT2P_WITH_CUDA) && GPT2P_TORCH_AT_LEAST(2, 1)
  using Key = typename std::decay_t<decltype(state_)>::key_type;
  auto key_of = [](const torch::Tensor& p) { return state_key<Key>(p); };
  // Check every group first, so that a step is never half fused.
  for (const auto& group : param_groups_) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
    if (o.amsgrad()) return false;
    for (const auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      if (!p.is_cuda() || p.scalar_type() != torch::kFloat32 || p.grad().is_sparse() ||
          p.grad().scalar_type() != p.scalar_type() || p.grad().device() != p.device()) {
        return false;
      }
    }
  }
  torch::NoGradGuard no_grad;
  size_t slot = 0;
  for (auto& group : param_groups_) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
    std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs, steps;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      auto it = state_.find(key_of(p));
      if (it == state_.end()) {
        auto st = std::make_unique<torch::optim::AdamWParamState>();
        st->step(0);
        st->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        st->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        it = state_.emplace(key_of(p), std::move(st)).first;
      }
      auto& st = static_cast<torch::optim::AdamWParamState&>(*it->second);
      if (slot >= device_steps_.size()) {
        device_steps_.push_back(torch::empty({}, p.options().dtype(torch::kFloat32)));
        synced_steps_.push_back(-1);
      }
      if (synced_steps_[slot] != st.step() || device_steps_[slot].device() != p.device()) {
        device_steps_[slot] = torch::full({}, static_cast<float>(st.step()),
                                          p.options().dtype(torch::kFloat32));
      }
      st.step(st.step() + 1);  // the device counts get their +1 below, before the kernel
      synced_steps_[slot] = st.step();
      params.push_back(p);
      grads.push_back(p.grad());
      exp_avgs.push_back(st.exp_avg());
      exp_avg_sqs.push_back(st.exp_avg_sq());
      steps.push_back(device_steps_[slot]);
      ++slot;
    }
    if (params.empty()) continue;
    // As torch.optim's _fused_adamw does: the kernel reads the step count, it does not advance it
    // (a count of 0 would divide by a zero bias correction).
    at::_foreach_add_(steps, 1);
    at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, steps, o.lr(),
                      std::get<0>(o.betas()), std::get<1>(o.betas()), o.weight_decay(), o.eps(),
                      /*amsgrad=*/false, /*maximize=*/false);
  }
  return true;
#else
  return false;
#endif
}

}  // namespace gpt2p::compat
