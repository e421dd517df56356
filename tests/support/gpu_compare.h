// What the GPU kernel tests share: the relative difference they compare by, and the skip on a
// machine without a GPU.
#pragma once

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>

namespace gpt2p::testing {

// Largest |a - b| relative to the largest |b|, in float64 on the CPU.
inline double rel_diff(const torch::Tensor& a, const torch::Tensor& b) {
  const auto a64 = a.to(torch::kCPU, torch::kFloat64), b64 = b.to(torch::kCPU, torch::kFloat64);
  const double scale = std::max(b64.abs().max().item<double>(), 1e-30);
  return (a64 - b64).abs().max().item<double>() / scale;
}

}  // namespace gpt2p::testing

#define GPT2P_REQUIRE_GPU() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU"
