// Gradient-norm clipping with PyTorch's multi-tensor kernels: torch.nn.utils.clip_grad_norm_'s rule
// (scale every gradient by max_norm / (norm + 1e-6) when that is below 1) in a few launches, where
// libtorch's C++ clip_grad_norm_ runs a chain of kernels per parameter (~150 for GPT-2, 1-2 ms of
// launches per step on a GPU).
#pragma once

#include <torch/types.h>

#include <vector>

namespace gpt2p::parallel {

// Sum of squares of every element of `grads`, as a float64 scalar tensor on their device (CPU for
// an empty list). Per-tensor norms come from one _foreach_norm call; their squares add in float64.
torch::Tensor grad_sq_norm(const std::vector<torch::Tensor>& grads);

// Loss-scaled gradients (loss_scaler.h) are `1 / inv_scale` times the true ones: every function
// below takes inv_scale, returns the true norm, and leaves the true (clipped) gradients, so the
// unscaling costs no pass of its own. max_norm 0: no clipping (with inv_scale 1 the gradients are
// then left as they are). With a power-of-two scale the results are the unscaled run's bits.

// Scales `grads` in place by inv_scale * min(1, max_norm / (norm + 1e-6)), `norm` being the true
// norm. Returns the factor used (1 when nothing was scaled).
double scale_to_max_norm(const std::vector<torch::Tensor>& grads, double norm, double max_norm,
                         double inv_scale = 1.0);

// clip_grad_norm_ over the defined gradients of `params`; returns their total norm before
// clipping.
double clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm);

// The same without waiting for the device: the norm and the factor stay device tensors, and every
// gradient is multiplied by min(1, max_norm / (norm + 1e-6)), as torch.nn.utils.clip_grad_norm_
// does in Python. The host never reads the norm, so the step's kernels queue without a gap
// (reading it cost 1.2 ms of an idle GPU per step of GPT-2 on an H200). Returns the norm (float64
// scalar on the gradients' device; CPU zero for no gradients).
torch::Tensor clip_grad_norm_queued(const std::vector<torch::Tensor>& params, double max_norm,
                                    double inv_scale = 1.0);

// The factor gradients are multiplied by, as a device tensor of type `type`, from their true norm
// (a float64 device scalar): inv_scale * min(1, max_norm / (norm + 1e-6)), or inv_scale without
// clipping. Undefined when it is 1 for sure (nothing to multiply).
torch::Tensor unscale_clip_factor(const torch::Tensor& norm, double max_norm, double inv_scale,
                                  torch::ScalarType type);

}  // namespace gpt2p::parallel
