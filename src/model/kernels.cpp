#include "gpt2p/model/kernels.h"

#include "gpt2p/core/error.h"

namespace gpt2p::model {

bool fused_kernels_built() {
#if GPT2P_WITH_CUDA
  return true;
#else
  return false;
#endif
}

Kernels parse_kernels(const std::string& name, bool cuda_device) {
  if (name == "reference") return Kernels::kReference;
  if (name == "auto") {
    return fused_kernels_built() && cuda_device ? Kernels::kFused : Kernels::kReference;
  }
  GPT2P_CHECK(name == "fused", "--kernels " << name << " is not known",
              "pass --kernels auto, fused or reference");
  GPT2P_CHECK(fused_kernels_built(),
              "--kernels fused: this build has no CUDA kernels (its Torch has no CUDA)",
              "build against a CUDA libtorch, or pass --kernels reference");
  GPT2P_CHECK(cuda_device, "--kernels fused runs on CUDA devices only",
              "pass --device cuda, or --kernels reference (or auto) on the CPU");
  return Kernels::kFused;
}

const char* to_string(Kernels kernels) {
  return kernels == Kernels::kFused ? "fused" : "reference";
}

}  // namespace gpt2p::model
