#include "gpt2p/parallel/data_parallel/grad_norm.h"

#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_norm.h>

#include <algorithm>
#include <cmath>

#include "gpt2p/compat/version.h"

namespace gpt2p::parallel {

torch::Tensor grad_sq_norm(const std::vector<torch::Tensor>& grads) {
  const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  if (grads.empty()) return torch::zeros({}, f64);
  const std::vector<torch::Tensor> norms = at::_foreach_norm(grads, 2);
  return torch::stack(norms).to(torch::kFloat64).pow(2).sum();
}

double scale_to_max_norm(const std::vector<torch::Tensor>& grads, double norm, double max_norm,
                         double inv_scale) {
  const double clip = max_norm > 0 ? std::min(1.0, max_norm / (norm + 1e-6)) : 1.0;
  const double coef = clip * inv_scale;
  if (coef == 1.0 || grads.empty()) return 1.0;
  at::_foreach_mul_(grads, coef);
  return coef;
}

double clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm) {
  std::vector<torch::Tensor> grads;
  for (const auto& p : params) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  const double norm = std::sqrt(grad_sq_norm(grads).item<double>());
  scale_to_max_norm(grads, norm, max_norm);
  return norm;
}

torch::Tensor unscale_clip_factor(const torch::Tensor& norm, double max_norm, double inv_scale,
                                  torch::ScalarType type) {
  if (max_norm <= 0) {
    if (inv_scale == 1.0) return {};
    return torch::full({}, inv_scale, norm.options().dtype(torch::kFloat64)).to(type);
  }
  auto coef = (max_norm / (norm + 1e-6)).clamp_max(1.0);
  if (inv_scale != 1.0) coef = coef * inv_scale;
  return coef.to(type);
}

torch::Tensor clip_grad_norm_queued(const std::vector<torch::Tensor>& params, double max_norm,
                                    double inv_scale) {
  std::vector<torch::Tensor> grads;
  for (const auto& p : params) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  auto norm = grad_sq_norm(grads).sqrt();
  if (inv_scale != 1.0) norm = norm * inv_scale;
  if (grads.empty()) return norm;
  const auto coef = unscale_clip_factor(norm, max_norm, inv_scale, grads.front().scalar_type());
  if (!coef.defined()) return norm;
#if GPT2P_TORCH_AT_LEAST(2, 1)
  at::_foreach_mul_(grads, coef);
#else
  for (auto& g : grads) g.mul_(coef);
#endif
  return norm;
}

}  // namespace gpt2p::parallel
