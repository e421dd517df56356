// libtorch's profiler, where this libtorch has it (compat/version.h).
#pragma once

#include <torch/torch.h>

#include <string>

namespace gpt2p::compat {

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

}  // namespace gpt2p::compat
