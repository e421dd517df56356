// The libtorch versions the project builds against: Debian's 1.13 (CPU) and PyTorch 2.x (CUDA).
// Every difference between them lives in include/gpt2p/compat/ and src/compat/, and only there:
//   version.h   this macro and the version string
//   attention.h causal attention and the choice of scaled_dot_product_attention's kernels
//   rng.h       generators and their saved states
//   device.h    CUDA or CPU: autocast, TF32, synchronisation, peak memory, a device clock
//   profiler.h  libtorch's profiler (Kineto)
//   adamw.h     AdamW with PyTorch's fused kernel where this libtorch has it
#pragma once

#include <torch/version.h>

#define GPT2P_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||        \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace gpt2p::compat {

// "major.minor.patch" of the torch we were compiled against.
inline const char* torch_version() { return TORCH_VERSION; }

}  // namespace gpt2p::compat
