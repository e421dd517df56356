// How the model computes, as the trainers' flags choose it (torch-free; names: core/names.h).
#pragma once

#include <array>
#include <string>

#include "gpt2p/core/names.h"

namespace gpt2p::model {

// --precision: fp32 (true float32 matmuls), tf32 (float32 tensors, TF32 tensor-core matmuls),
// bf16 (autocast to bfloat16; GPUs of compute capability 8.0 or newer, or the CPU) or fp16
// (autocast to float16 on a CUDA GPU, with dynamic loss scaling: parallel/train/loss_scaler.h; the
// half type of a V100). bf16 and fp16 keep float32 master weights and optimizer state.
enum class Precision { kFp32, kTf32, kBf16, kFp16 };
constexpr std::array<Named<Precision>, 4> names(Precision) {
  return {{{Precision::kFp32, "fp32"},
           {Precision::kTf32, "tf32"},
           {Precision::kBf16, "bf16"},
           {Precision::kFp16, "fp16"}}};
}

// Refuses a precision the device cannot run, with the reason and the fix: fp16 off CUDA (CPU
// autocast has no float16 on every libtorch the project builds against) and bf16 on a GPU older
// than compute capability 8.0 (a V100 has no bfloat16 tensor cores). `capability` as
// resolve_kernels' (0 for the CPU).
void check_precision(Precision precision, bool cuda_device, int capability);

// --loss-positions: which positions the LM head is computed for (lm_head_loss.h). kTargets: only
// where the loss mask is non-zero (the default; same loss and gradients). kAll: every position,
// with zero weights where the mask is 0 (what a plain head computes; kept to compare the two).
enum class LossPositions { kTargets, kAll };
constexpr std::array<Named<LossPositions>, 2> names(LossPositions) {
  return {{{LossPositions::kTargets, "targets"}, {LossPositions::kAll, "all"}}};
}

// The share of each row's positions the LM head runs at: every one under kAll, else the share
// whose loss counts (`loss_fraction`, the data's target tokens). What the head's FLOPs, its kept
// activations and whether its row count can change (a graph's fixed shape) follow from.
constexpr double head_row_share(LossPositions positions, double loss_fraction) {
  return positions == LossPositions::kAll ? 1.0 : loss_fraction;
}

// --kernels: which implementation runs the operations that have one of the project's CUDA
// kernels (src/kernels/): the LM head's softmax and cross-entropy (lm_head_loss.h) and the
// blocks' residual adds with their LayerNorms and linear layers (gpt2.h).
//   kReference: ATen operations; any device, and the only path of a CPU build.
//   kFused: the kernels; CUDA tensors in a CUDA build only.
//   kAuto: a request only (resolve_kernels): kFused where built and on a CUDA device of compute
//          capability 8.0 or newer (A100, H100, H200), kReference on older GPUs (a V100: 7.0).
// kReference and kFused give the same losses and gradients up to rounding
// (tests/gpu/test_kernels_gpu.cpp, tests/gpu/test_norm_gpu.cpp).
enum class Kernels { kAuto, kFused, kReference };
constexpr std::array<Named<Kernels>, 3> names(Kernels) {
  return {
      {{Kernels::kAuto, "auto"}, {Kernels::kFused, "fused"}, {Kernels::kReference, "reference"}}};
}

// --recompute: which activations backward recomputes instead of keeping from forward (recompute.h).
// kNone keeps every activation. kBlocks keeps only each transformer block's input and runs the
// block's forward again inside backward (with the dropout masks it drew the first time): peak
// activation memory falls to about one block's, for about one more forward of the blocks.
enum class Recompute { kNone, kBlocks };
constexpr std::array<Named<Recompute>, 2> names(Recompute) {
  return {{{Recompute::kNone, "none"}, {Recompute::kBlocks, "blocks"}}};
}

// Whether this build has the fused kernels (Torch with CUDA).
bool fused_kernels_built();

// The oldest GPUs the fused kernels are built and tested for: compute capability 8.0 (sm_80). They
// use bf16 and cuBLASLt paths that sm_70 (V100) lacks or that were never run there.
inline constexpr int kFusedKernelsMinCapability = 80;

// Where kernels are to run: the device, its compute capability as 10 * major + minor
// (compat::compute_capability; 0 for the CPU), the run's precision, and whether this build has
// the fused kernels.
struct KernelTarget {
  bool cuda_device = false;
  int capability = 0;
  Precision precision = Precision::kFp32;
  bool built = fused_kernels_built();
};

// The kernels a request runs with: kFused or kReference. The fused kernels compute in float32 or
// bfloat16: an fp16 run takes the reference kernels. A fused request that cannot run fails with
// the reason and the fix.
Kernels resolve_kernels(Kernels requested, const KernelTarget& target);

// Why kAuto chose kReference on a CUDA device, for the start-up line ("sm_70 is older than the
// fused kernels' sm_80"), or "" when it did not.
std::string kernels_fallback_reason(Kernels requested, const KernelTarget& target);

}  // namespace gpt2p::model
