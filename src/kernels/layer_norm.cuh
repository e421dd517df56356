// What the LayerNorm kernels (layer_norm_forward.cu, layer_norm_backward.cu) share: a row per
// block, each thread holding up to kMaxPacks vectors (or scalars) of the row's columns; the row's
// loads, stores and block-wide sums; the block shape for a row width; dispatch on the storage
// types and vector counts; and the host checks of shapes and launches (nvcc only).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "element.cuh"
#include "gpt2p/core/error.h"
#include "gpt2p/kernels/layer_norm.h"

namespace gpt2p::kernels {

// Threads of a row's block: the vector path spreads at most 256 threads over a row (8 vectors of
// 4 each for 8192 columns), the scalar path at most 1024 (8 scalars each).
inline constexpr int kMaxPacks = 8;
template <int kWidth>
inline constexpr int kMaxThreads = kWidth == 1 ? 1024 : 256;

// Pack i of p, as floats.
template <int kWidth, typename T>
__device__ __forceinline__ void load(const T* p, int64_t i, float (&out)[kWidth]) {
  const Pack<T, kWidth> pack = reinterpret_cast<const Pack<T, kWidth>*>(p)[i];
#pragma unroll
  for (int j = 0; j < kWidth; ++j) out[j] = to_float(pack.v[j]);
}

template <int kWidth, typename T>
__device__ __forceinline__ void store(T* p, int64_t i, const float (&in)[kWidth]) {
  Pack<T, kWidth> pack;
#pragma unroll
  for (int j = 0; j < kWidth; ++j) pack.v[j] = from_float<T>(in[j]);
  reinterpret_cast<Pack<T, kWidth>*>(p)[i] = pack;
}

// Sum over the block, the same in every thread: warps by butterfly shuffles (every lane ends with
// the same value), then every thread adds the warps' sums in warp order. `shared` holds one entry
// per warp; it is free again when this returns.
__device__ __forceinline__ float2 block_sum(float2 v, float2* shared) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    v.x += __shfl_xor_sync(0xffffffffu, v.x, offset);
    v.y += __shfl_xor_sync(0xffffffffu, v.y, offset);
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float2 total = make_float2(0.0f, 0.0f);
  const int warps = static_cast<int>(blockDim.x / 32);
  for (int w = 0; w < warps; ++w) {
    total.x += shared[w].x;
    total.y += shared[w].y;
  }
  __syncthreads();
  return total;
}

__device__ __forceinline__ float block_sum(float v, float2* shared) {
  return block_sum(make_float2(v, 0.0f), shared).x;
}

// Pack index of this thread's k-th vector in a row of `packs` vectors.
__device__ __forceinline__ int pack_index(int k) {
  return static_cast<int>(threadIdx.x + k * blockDim.x);
}

// Vectors per thread (1, 2, 4 or 8) and threads (a multiple of 32) for a row of `packs` vectors.
struct RowShape {
  int packs_per_thread = 1;
  int threads = 32;
};

inline RowShape row_shape(int packs, int max_threads) {
  RowShape s;
  while (s.packs_per_thread < kMaxPacks &&
         (packs + s.packs_per_thread - 1) / s.packs_per_thread > max_threads) {
    s.packs_per_thread *= 2;
  }
  const int threads = (packs + s.packs_per_thread - 1) / s.packs_per_thread;
  s.threads = std::max(32, (threads + 31) / 32 * 32);
  return s;
}

// Calls f with std::integral_constant<int, n> for n = packs_per_thread.
template <typename F>
void with_packs(int packs_per_thread, F&& f) {
  switch (packs_per_thread) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    default: f(std::integral_constant<int, kMaxPacks>{}); break;
  }
}

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls f with TypeTag<float> or TypeTag<__nv_bfloat16>.
template <typename F>
void with_type(ElementType type, F&& f) {
  if (type == ElementType::kBFloat16) {
    f(TypeTag<__nv_bfloat16>{});
  } else {
    f(TypeTag<float>{});
  }
}

inline bool aligned(const void* p, size_t bytes) {
  return p == nullptr || reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

inline size_t element_size(ElementType type) { return type == ElementType::kBFloat16 ? 2 : 4; }

inline void check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  GPT2P_CHECK(err == cudaSuccess, what << ": kernel launch failed: " << cudaGetErrorString(err),
              "check that the GPU is healthy and the build targets its architecture "
              "(CMAKE_CUDA_ARCHITECTURES)");
}

inline void check_shape(const char* what, int64_t rows, int64_t cols) {
  GPT2P_CHECK(rows >= 0 && rows < (int64_t{1} << 31) && cols >= 1 && cols <= kLayerNormMaxCols,
              what << ": " << rows << " rows of " << cols << " columns",
              "pass 0 <= rows < 2^31 and 1 <= columns <= " << kLayerNormMaxCols);
}

}  // namespace gpt2p::kernels
