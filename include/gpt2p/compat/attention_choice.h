// --attention: the kernels torch's scaled_dot_product_attention may pick from (attention.h),
// torch-free so that option parsing needs no torch.
#pragma once

#include <array>

#include "gpt2p/core/names.h"

namespace gpt2p::compat {

// kAuto: all of them, in torch's order; otherwise only that one (cudnn from libtorch 2.4 on).
enum class Attention { kAuto, kFlash, kCudnn, kEfficient, kMath };
constexpr std::array<Named<Attention>, 5> names(Attention) {
  return {{{Attention::kAuto, "auto"},
           {Attention::kFlash, "flash"},
           {Attention::kCudnn, "cudnn"},
           {Attention::kEfficient, "efficient"},
           {Attention::kMath, "math"}}};
}

}  // namespace gpt2p::compat
