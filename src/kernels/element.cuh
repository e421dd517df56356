// Device helpers the kernels share: float32 arithmetic on float32 or bfloat16 storage, and
// vectorised row access (nvcc only).
#pragma once

#include <cuda_bf16.h>

namespace gpt2p::kernels {

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// kWidth elements moved as one access (kWidth * sizeof(T) bytes, 16 at most); kWidth = 1 for rows
// that are not aligned.
template <typename T, int kWidth>
struct alignas(sizeof(T) * kWidth) Pack {
  T v[kWidth];
};

}  // namespace gpt2p::kernels
