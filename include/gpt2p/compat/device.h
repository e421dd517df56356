// The device a run uses, CUDA or CPU, on every libtorch the project builds against
// (compat/version.h): autocast, TF32, synchronisation, peak memory and a clock on its timeline.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>

namespace gpt2p::compat {

// strict = true: float32 matmuls and convolutions are true fp32 (no TF32 on cuBLAS/cuDNN);
// false: TF32 allowed. A no-op for CPU-only builds.
void set_strict_fp32(bool strict);

// Turns autocast to `dtype` (torch::kBFloat16 or torch::kHalf) on for `device` (CUDA or CPU) while
// alive; a no-op for any other dtype (torch::kFloat32: no autocast).
class AutocastGuard {
 public:
  AutocastGuard(const torch::Device& device, torch::ScalarType dtype);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  torch::Device device_;
  bool enabled_;
  bool previous_ = false;
  torch::ScalarType previous_dtype_ = torch::kFloat32;
};

// Keeps autocast's cache of weight casts across the forwards of one step (pipeline micro-batches,
// gradient accumulation) while alive: each trainable weight is cast to the autocast type once per
// step, not once per forward, and every forward's graph shares that copy. Autocast itself stays
// as the AutocastGuards inside set it (backward runs outside them). The cache is cleared when the
// outermost scope or guard ends: end the scope before the weights change (the optimizer step).
// GPT2P_CAST_ONCE=0 in the environment turns it off (every forward casts again), to compare.
class AutocastCacheScope {
 public:
  AutocastCacheScope();
  ~AutocastCacheScope();
  AutocastCacheScope(const AutocastCacheScope&) = delete;
  AutocastCacheScope& operator=(const AutocastCacheScope&) = delete;

 private:
  bool active_;
};

// `weight` in `dtype` through autocast's cache (as autocast casts an operand): a trainable leaf
// tensor is cast once while an AutocastGuard or an AutocastCacheScope is open. Under no-grad (a
// custom autograd function's forward) the cached copy has no gradient function: use it only where
// the gradient of `weight` is computed by hand.
torch::Tensor cached_cast(const torch::Tensor& weight, torch::ScalarType dtype);

// Whether autocast is on for `device`'s type on this thread.
bool autocast_enabled(const torch::Device& device);
// The type autocast computes in for `device`'s type on this thread (torch::kBFloat16 or
// torch::kHalf), or `otherwise` when autocast is off.
torch::ScalarType autocast_dtype(const torch::Device& device, torch::ScalarType otherwise);

// Whether this build has CUDA and at least one GPU is visible.
bool cuda_available();
// The GPU's name ("NVIDIA H200"), or "" for the CPU.
std::string device_name(const torch::Device& device);
// The GPU's compute capability as 10 * major + minor (90 for an H200, 70 for a V100), or 0 for the
// CPU.
int compute_capability(const torch::Device& device);
// The GPU's PCI bus id ("0000:1B:00.0"): the same physical GPU gives the same id to every process
// of a host, whatever each process's CUDA_VISIBLE_DEVICES; "" for the CPU.
std::string device_bus_id(const torch::Device& device);
// The PCI bus id of CUDA device `index` of this process, as device_bus_id; "" without CUDA.
std::string gpu_bus_id(int index);
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
  // Records mark `i` (0 <= i < capacity) now, on torch's current stream; inside a CUDA graph's
  // capture, wherever each replay of the graph gets there.
  void mark(int i);
  // Seconds from mark `a` to mark `b`.
  double elapsed(int a, int b);

 private:
  struct Impl;
  Impl* impl_;
};

}  // namespace gpt2p::compat
