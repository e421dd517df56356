// Shared by the CPU and GPU optimizer tests: FusedAdamW against torch::optim::AdamW on the same
// parameters and gradients.
#pragma once

#include <gtest/gtest.h>

#include <cmath>

#include "gpt2p/compat/adamw.h"

namespace gpt2p::testing {

// Runs `steps` steps of both optimizers on copies of the same parameters (some without a
// gradient in some steps) and returns the largest relative difference of the parameters.
inline double fused_adamw_difference(const torch::Device& device, int steps, bool* all_fused) {
  torch::manual_seed(3);
  const std::vector<std::vector<int64_t>> shapes{{64, 32}, {32}, {5, 7, 3}, {1}};
  std::vector<torch::Tensor> a, b;
  for (const auto& s : shapes) {
    auto t = torch::randn(s, torch::kFloat32).to(device);
    a.push_back(t.clone().requires_grad_(true));
    b.push_back(t.clone().requires_grad_(true));
  }
  const auto options = torch::optim::AdamWOptions(1e-2).weight_decay(0.1);
  compat::FusedAdamW fused(a, options);
  torch::optim::AdamW plain(b, options);
  *all_fused = true;
  for (int step = 0; step < steps; ++step) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      if (step == 1 && i == 2) continue;  // no gradient this step
      auto g = torch::randn(shapes[i], torch::kFloat32).to(device);
      a[i].mutable_grad() = g.clone();
      b[i].mutable_grad() = g.clone();
    }
    fused.step();
    plain.step();
    *all_fused = *all_fused && fused.last_step_fused();
    fused.zero_grad();
    plain.zero_grad();
  }
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double diff = (a[i] - b[i]).abs().max().item<double>();
    const double rel = diff / (b[i].abs().max().item<double>() + 1e-12);
    // std::max drops NaN: a NaN or infinite parameter must fail the comparison instead.
    if (!std::isfinite(rel) || !torch::isfinite(a[i]).all().item<bool>()) return INFINITY;
    worst = std::max(worst, rel);
  }
  return worst;
}

}  // namespace gpt2p::testing
