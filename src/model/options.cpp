#include "gpt2p/model/options.h"

#include "gpt2p/core/error.h"

namespace gpt2p::model {

bool fused_kernels_built() {
#if GPT2P_WITH_CUDA
  return true;
#else
  return false;
#endif
}

Kernels resolve_kernels(Kernels requested, bool cuda_device) {
  switch (requested) {
    case Kernels::kReference: return Kernels::kReference;
    case Kernels::kAuto:
      return fused_kernels_built() && cuda_device ? Kernels::kFused : Kernels::kReference;
    case Kernels::kFused: break;
  }
  GPT2P_CHECK(fused_kernels_built(),
              "--kernels fused: this build has no CUDA kernels (its Torch has no CUDA)",
              "build against a CUDA libtorch, or pass --kernels reference");
  GPT2P_CHECK(cuda_device, "--kernels fused runs on CUDA devices only",
              "pass --device cuda, or --kernels reference (or auto) on the CPU");
  return Kernels::kFused;
}

}  // namespace gpt2p::model
