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

Kernels resolve_kernels(Kernels requested, bool cuda_device, int capability, bool built) {
  switch (requested) {
    case Kernels::kReference: return Kernels::kReference;
    case Kernels::kAuto:
      return built && cuda_device && capability >= kFusedKernelsMinCapability
                 ? Kernels::kFused
                 : Kernels::kReference;
    case Kernels::kFused: break;
  }
  GPT2P_CHECK(built,
              "--kernels fused: this build has no CUDA kernels (its Torch has no CUDA)",
              "build against a CUDA libtorch, or pass --kernels reference");
  GPT2P_CHECK(cuda_device, "--kernels fused runs on CUDA devices only",
              "pass --device cuda, or --kernels reference (or auto) on the CPU");
  GPT2P_CHECK(capability >= kFusedKernelsMinCapability,
              "--kernels fused needs a GPU of compute capability "
                  << kFusedKernelsMinCapability / 10 << "." << kFusedKernelsMinCapability % 10
                  << " or newer; this one is " << capability / 10 << "." << capability % 10,
              "pass --kernels auto or reference (ATen's operations) on this GPU");
  return Kernels::kFused;
}

std::string kernels_fallback_reason(Kernels requested, bool cuda_device, int capability,
                                    bool built) {
  if (requested != Kernels::kAuto || !cuda_device || !built ||
      capability >= kFusedKernelsMinCapability) {
    return "";
  }
  return "sm_" + std::to_string(capability) + " is older than the fused kernels' sm_" +
         std::to_string(kFusedKernelsMinCapability);
}

}  // namespace gpt2p::model
