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

void check_precision(Precision precision, bool cuda_device, int capability) {
  if (precision == Precision::kFp16) {
    GPT2P_CHECK(cuda_device, "--precision fp16 autocasts on CUDA GPUs only",
                "pass --precision bf16 or fp32 on the CPU");
  }
  if (precision == Precision::kBf16 && cuda_device) {
    GPT2P_CHECK(capability >= 80,
                "--precision bf16 needs a GPU with bfloat16 tensor cores (compute capability 8.0 "
                "or newer); this one is "
                    << capability / 10 << "." << capability % 10,
                "pass --precision fp16 (with loss scaling) or fp32 on this GPU");
  }
}

namespace {

// Why the fused kernels cannot run at `target`, or "" when they can.
std::string fused_refusal(const KernelTarget& target) {
  if (!target.built) return "this build has no CUDA kernels (its Torch has no CUDA)";
  if (!target.cuda_device) return "the fused kernels run on CUDA devices only";
  if (target.capability < kFusedKernelsMinCapability) {
    return "sm_" + std::to_string(target.capability) + " is older than the fused kernels' sm_" +
           std::to_string(kFusedKernelsMinCapability);
  }
  if (target.precision == Precision::kFp16) {
    return "the fused kernels compute in float32 or bfloat16, not float16";
  }
  return "";
}

}  // namespace

Kernels resolve_kernels(Kernels requested, const KernelTarget& target) {
  const std::string refusal = fused_refusal(target);
  switch (requested) {
    case Kernels::kReference: return Kernels::kReference;
    case Kernels::kAuto: return refusal.empty() ? Kernels::kFused : Kernels::kReference;
    case Kernels::kFused: break;
  }
  GPT2P_CHECK(target.built,
              "--kernels fused: this build has no CUDA kernels (its Torch has no CUDA)",
              "build against a CUDA libtorch, or pass --kernels reference");
  GPT2P_CHECK(target.cuda_device, "--kernels fused runs on CUDA devices only",
              "pass --device cuda, or --kernels reference (or auto) on the CPU");
  GPT2P_CHECK(target.capability >= kFusedKernelsMinCapability,
              "--kernels fused needs a GPU of compute capability "
                  << kFusedKernelsMinCapability / 10 << "." << kFusedKernelsMinCapability % 10
                  << " or newer; this one is " << target.capability / 10 << "."
                  << target.capability % 10,
              "pass --kernels auto or reference (ATen's operations) on this GPU");
  GPT2P_CHECK(refusal.empty(), "--kernels fused with --precision fp16: " << refusal,
              "pass --kernels auto or reference with fp16, or --precision bf16 or fp32");
  return Kernels::kFused;
}

std::string kernels_fallback_reason(Kernels requested, const KernelTarget& target) {
  if (requested != Kernels::kAuto || !target.cuda_device || !target.built) return "";
  if (target.capability < kFusedKernelsMinCapability) return fused_refusal(target);
  return target.precision == Precision::kFp16 ? "fp16 runs on the reference kernels" : "";
}

}  // namespace gpt2p::model
