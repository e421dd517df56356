// Every difference between the libtorch versions we build against (Debian's 1.13 CPU build and
// PyTorch 2.x with CUDA) lives here, and only here.
#pragma once

#include <torch/torch.h>
#include <torch/version.h>

#include <cstdint>
#include <string>

#define GPT2P_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||        \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace gpt2p::compat {

// torch::scaled_dot_product_attention exists from 2.0 on.
inline constexpr bool kHasFusedAttention = GPT2P_TORCH_AT_LEAST(2, 0);

// Causal scaled-dot-product attention, q/k/v of shape [B, H, T, D]. On libtorch >= 2.0 the fused
// kernel; on 1.13 an explicit masked softmax. dropout_p applies to attention weights.
torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, double dropout_p, bool training);

// The same computation always done explicitly, so tests can compare the two paths.
torch::Tensor causal_attention_reference(const torch::Tensor& q, const torch::Tensor& k,
                                         const torch::Tensor& v);

// --attention: which kernels torch's scaled_dot_product_attention may pick from on libtorch >= 2.0:
// "auto" (all of them, torch's order), or only "flash", "cudnn" (2.4 and later), "efficient" or
// "math". On 1.13 the explicit computation is the only one: "auto" and "math" are accepted, the
// others throw.
void set_attention_backend(const std::string& name);

// The kernel causal_attention runs for [batch, heads, seq, head_dim] inputs of `dtype` on
// `device` under the current choice: "flash", "cudnn", "efficient", "math", or "explicit"
// (libtorch 1.13). Asks torch's own dispatcher (at::_fused_sdp_choice) with one sequence.
std::string attention_backend(const torch::Device& device, torch::ScalarType dtype, int64_t heads,
                              int64_t seq, int64_t head_dim, double dropout);

// "major.minor.patch" of the torch we were compiled against.
const char* torch_version();

// A CPU generator seeded with `seed`, independent of torch's global one (deterministic init).
at::Generator make_cpu_generator(uint64_t seed);

// Bytes of torch's default CPU generator state, and restoring them (checkpoints).
std::string cpu_rng_state();
void set_cpu_rng_state(const std::string& bytes);

// This process's generator states for a run on `device`: the CPU generator and, on a GPU, that
// GPU's (dropout there draws from it), as one byte string; restoring accepts it or a bare
// cpu_rng_state() (older checkpoints).
std::string rng_state(const torch::Device& device);
void set_rng_state(const torch::Device& device, const std::string& bytes);

// strict = true: float32 matmuls and convolutions are true fp32 (no TF32 on cuBLAS/cuDNN);
// false: TF32 allowed. A no-op for CPU-only builds.
void set_strict_fp32(bool strict);

// ---- Devices (src/core/compat_device.cpp) ----

// Turns bf16 autocast on for `device` (CUDA or CPU) while alive; a no-op when !enabled.
class AutocastGuard {
 public:
  AutocastGuard(const torch::Device& device, bool enabled);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  torch::Device device_;
  bool enabled_;
  bool previous_ = false;
};

// Whether autocast is on for `device`'s type on this thread (AutocastGuard always picks bf16).
bool autocast_enabled(const torch::Device& device);

// Whether this build has CUDA and at least one GPU is visible.
bool cuda_available();
// The GPU's name ("NVIDIA H200"), or "" for the CPU.
std::string device_name(const torch::Device& device);
// Makes `device` current for this thread (cudaSetDevice); no-op for the CPU.
void set_current_device(const torch::Device& device);
// Blocks until the work queued on torch's current stream of `device` is done (no-op on CPU).
void synchronize(const torch::Device& device);
// Peak bytes allocated by torch on `device` since the last reset (CUDA caching allocator), or the
// process's peak resident set size for the CPU.
int64_t peak_memory_bytes(const torch::Device& device);
void reset_peak_memory(const torch::Device& device);

// Seconds between points on the device's timeline: CUDA events on the current stream on GPUs,
// the host clock on CPUs. mark() is cheap; elapsed() blocks until both marks have happened.
class DeviceClock {
 public:
  DeviceClock(const torch::Device& device, int capacity);
  ~DeviceClock();
  DeviceClock(const DeviceClock&) = delete;
  DeviceClock& operator=(const DeviceClock&) = delete;
  // Records mark `i` (0 <= i < capacity) now, on torch's current stream.
  void mark(int i);
  // Seconds from mark `a` to mark `b`.
  double elapsed(int a, int b);

 private:
  struct Impl;
  Impl* impl_;
};

// ---- Profiler (src/core/compat_profiler.cpp) ----

// libtorch's profiler (Kineto) over the operators and, on a GPU, every CUDA kernel between start()
// and stop(), which writes a Chrome trace (chrome://tracing, Perfetto; analysis/kernel_table.py
// turns it into a per-kernel table). One at a time per process.
class Profiler {
 public:
  // Whether this libtorch has Kineto; require_available() throws the reason and the fix if not.
  static bool available();
  static void require_available();
  explicit Profiler(const torch::Device& device);
  ~Profiler();  // stops an unfinished profile without writing it
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;
  void start();
  // Synchronises the device, stops and writes the trace to `path` (throws if it could not).
  void stop(const std::string& path);
  bool running() const { return running_; }

 private:
  torch::Device device_;
  bool running_ = false;
};

// ---- Optimizer (src/core/compat_device.cpp) ----

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

 private:
  bool fused_step();
  // Per parameter: the step count as a device tensor (the kernel's form), and the host count it
  // was made from (a checkpoint load changes the host count).
  std::vector<torch::Tensor> device_steps_;
  std::vector<int64_t> synced_steps_;
  bool fused_ = false;
};

}  // namespace gpt2p::compat
