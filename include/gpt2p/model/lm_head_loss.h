// The LM head and its cross-entropy as one operation, the way training needs them.
//
// Computed plainly, the head of GPT-2 is the most expensive layer of a training step: logits for
// every position ([rows * T, 50304]), cast to float32, log-softmax, and in backward the same
// tensors again. linear_cross_entropy instead
//   - computes the head only for the positions whose loss counts (a translation batch's target
//     tokens: about 9% of HW5's positions at sequence 128, the rest is source text and padding),
//   - works through them in chunks, so no [positions, vocab] tensor outlives its chunk,
//   - and computes the gradients of hidden states and weight in the forward pass (softmax minus
//     one-hot, two GEMMs per chunk), so backward only scales them by the incoming gradient.
// Loss and gradients are those of the plain computation (the tests compare them). Until its
// backward, each call keeps the hidden-state gradient ([n, C]) and a weight-sized gradient
// (V' x C, float32: 154 MB for GPT-2): what a pipeline holds per micro-batch in flight instead
// of that micro-batch's logits.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "gpt2p/model/options.h"

namespace gpt2p::model {

// The positions of one micro-batch that the loss counts.
struct LossRows {
  torch::Tensor index;    // int64 [n]: positions in the micro-batch's flattened [rows * T]
  torch::Tensor labels;   // int64 [n]: the label at each position
  torch::Tensor weights;  // float32 [n]: its weight in the loss (mask * scale)
};

// One LossRows per block of R / parts rows of labels and mask [R, T] (R divisible by parts). The
// weight of a position is mask * scale. The mask is read on the host (a device mask costs one
// synchronisation); the results live on labels' device.
std::vector<LossRows> loss_rows(const torch::Tensor& labels, const torch::Tensor& mask, int parts,
                                double scale, LossPositions positions);

// `rows` with every weight times `scale` (loss scaling: parallel/train/loss_scaler.h); `rows`
// itself when scale is 1.
LossRows scaled(const LossRows& rows, double scale);

// Rows per chunk of linear_cross_entropy by default: 4096 x 50304 logits are 0.4 GB in bf16.
inline constexpr int64_t kLossChunkRows = 4096;

// With Kernels::kFused, one kernel turns a chunk's logits into their gradient in place
// (kernels/cross_entropy.h) and the weight gradient accumulates in float32 inside the GEMM
// (kernels/fused_head.h); kReference uses ATen ops (log_softmax, exp, scatter) over each chunk.
//
// sum_i weights[i] * CE(hidden[i] . weight[:vocab_size]^T, labels[i]) for hidden [n, C] and
// weight [V' >= vocab_size, C] (columns past vocab_size never count). Computed in `compute`
// (float32 or bfloat16) with the softmax in float32. kFused needs CUDA tensors. Differentiable in
// hidden and weight when grad mode is on and either requires grad; otherwise only the loss is
// computed. `accumulate_grad`: where weight's .grad exists in the gradient's type and shape,
// backward adds the weight's gradient into it in one pass instead of handing autograd a scaled
// copy to add (a pipeline stage's micro-batches with .grad kept allocated:
// GPT2Impl::set_grad_accumulation).
torch::Tensor linear_cross_entropy(const torch::Tensor& hidden, const torch::Tensor& weight,
                                   const torch::Tensor& labels, const torch::Tensor& weights,
                                   int64_t vocab_size, torch::ScalarType compute,
                                   int64_t chunk_rows = kLossChunkRows,
                                   Kernels kernels = Kernels::kReference,
                                   bool accumulate_grad = false);

}  // namespace gpt2p::model
