// Activation recompute: a function whose backward computes its forward again instead of keeping
// what the forward computed (--recompute blocks runs every transformer block this way, gpt2.h).
//
// checkpointed(fn, inputs, params) returns what fn(inputs) returns. When autograd records (grad
// mode on, and an input or one of `params` requires grad), fn runs without grad and autograd keeps
// only the inputs and one node, named kCheckpointNode, whose backward
//   1. runs fn again, with grad, on detached copies of the inputs (each requiring grad as its
//      original does), under the autocast state and from the random generator states the forward
//      ran with: the CPU generator and, for CUDA inputs, their GPU's (compat/rng.h). Dropout draws
//      the same masks, and the generators are put back afterwards, so the random stream after
//      backward is the one without recompute;
//   2. runs backward from the recomputed outputs with the gradients that reached the outputs,
//      inside the backward that called it (reentrant, as PyTorch's torch.utils.checkpoint with
//      use_reentrant=True does). Outputs whose gradient is undefined (unused) are left out;
//   3. returns the copies' gradients as the inputs'.
// Parameters get their gradients in step 2 through autograd's own AccumulateGrad nodes, once per
// backward: .grad accumulates as usual, hooks registered on them fire (grad_sync.h's buckets), and
// autograd Functions inside fn run their backward as usual (deferred_linear.h's weight-gradient
// store is filled then). Nothing is computed twice but the forward.
//
// The generators saved are those of the first defined input's device. `params` are the tensors
// fn reads besides its inputs (a module's parameters). They are not the node's inputs and only
// decide, with the inputs, whether there is anything to record, so a function whose inputs do not
// require grad still gets its parameters' gradients. Inputs may be
// undefined (fn sees them undefined again); outputs may be undefined or not differentiable
// (integers): those are returned without history.
//
// What fn must be: the same computation when backward calls it again (the same modules, in the
// same training mode, with the same kernels and weight-gradient store), deterministic given its
// inputs, parameters, generator states and autocast state, and not modifying its inputs in place.
// An input modified in place after the forward fails backward, as a saved tensor of any autograd
// node does. The saved inputs are freed by the first backward unless it retains the graph.
//
// Not supported: double backward (the recomputed graph is not differentiable again), and asking
// torch::autograd::grad() or backward(inputs) for the gradient of a tensor fn reads besides its
// inputs: autograd reaches those only through the inner backward, which accumulates into .grad.
// compat::AutocastGuard's autocast (bf16 or fp16) is replayed, and a forward that ran without
// autocast needs its backward outside autocast too (the trainers' backward always is). Under
// autocast, fn's parameters should not be used outside fn in the same autocast scope: autocast
// caches a parameter's half copy, and the copy made in the no-grad forward carries no gradient.
#pragma once

#include <torch/types.h>

#include <functional>
#include <vector>

namespace gpt2p::model {

using CheckpointFn = std::function<std::vector<torch::Tensor>(const std::vector<torch::Tensor>&)>;

// The name() of the autograd node a recording checkpointed() call adds.
inline constexpr char kCheckpointNode[] = "gpt2p::model::CheckpointBackward";

std::vector<torch::Tensor> checkpointed(const CheckpointFn& fn,
                                        const std::vector<torch::Tensor>& inputs,
                                        const std::vector<torch::Tensor>& params = {});

}  // namespace gpt2p::model
