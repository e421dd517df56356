// Which implementation runs the operations that have one of the project's CUDA kernels
// (src/kernels/): the LM head's softmax and cross-entropy (lm_head_loss.h) and the blocks'
// residual adds with their LayerNorms (gpt2.h).
//   kReference: ATen operations; any device, and the only path of a CPU build.
//   kFused: the kernels; CUDA tensors in a CUDA build only.
// Both give the same losses and gradients up to rounding (tests/gpu/test_kernels_gpu.cpp,
// tests/gpu/test_norm_gpu.cpp).
#pragma once

#include <string>

namespace gpt2p::model {

enum class Kernels { kReference, kFused };

// Whether this build has the fused kernels (Torch with CUDA).
bool fused_kernels_built();

// --kernels: "reference", "fused", or "auto" (fused where built and on a CUDA device). A fused
// request that cannot run fails with the reason and the fix.
Kernels parse_kernels(const std::string& name, bool cuda_device);
const char* to_string(Kernels kernels);

}  // namespace gpt2p::model
