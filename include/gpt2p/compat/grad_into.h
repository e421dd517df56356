// Where a backward may add a parameter's gradient into its .grad in place instead of handing
// autograd a new tensor to add: the fused layers' accumulate_grad (kernels/) and the LM head's
// (model/lm_head_loss.h), on any device.
#pragma once

#include <torch/torch.h>

namespace gpt2p::compat {

// `param`'s .grad when it exists, float32, contiguous, of param's shape and on `device`; else
// undefined (the caller returns the gradient to autograd as usual).
inline torch::Tensor grad_to_add_into(const torch::Tensor& param, const torch::Device& device) {
  if (!param.defined()) return {};
  torch::Tensor grad = param.grad();
  const bool usable = grad.defined() && grad.scalar_type() == torch::kFloat32 &&
                      grad.is_contiguous() && grad.sizes() == param.sizes() &&
                      grad.device() == device;
  return usable ? grad : torch::Tensor();
}

}  // namespace gpt2p::compat
