// kernels/cross_entropy.h: one block per row, two passes over it. The first finds the row's
// maximum and sum of exponentials (each thread over its 16-byte vectors, then a block
// reduction of (max, sum) pairs); the second writes the gradient in place. A 50304-column bf16
// row is 98 KiB, so the second pass mostly reads from L2.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "element.cuh"
#include "gpt2p/core/error.h"
#include "gpt2p/kernels/cross_entropy.h"

namespace gpt2p::kernels {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;

// (max, sum of exp(x - max)) pairs, merged.
__device__ __forceinline__ void merge(float& m, float& s, float m2, float s2) {
  const float big = fmaxf(m, m2);
  if (big == -INFINITY) return;  // both empty
  s = s * __expf(m - big) + s2 * __expf(m2 - big);
  m = big;
}

template <typename T, int kWidth>
__global__ void __launch_bounds__(kThreads)
    softmax_cross_entropy_kernel(T* __restrict__ logits, int64_t ld, int vocab, int padded,
                                 const int64_t* __restrict__ labels,
                                 const float* __restrict__ weights, float* __restrict__ losses,
                                 bool grad) {
  using P = Pack<T, kWidth>;
  const int64_t row = blockIdx.x;
  T* x = logits + row * ld;
  P* xv = reinterpret_cast<P*>(x);
  const int packs = padded / kWidth;
  const float w = weights[row];
  const int64_t label = labels[row];
  if (w == 0.0f) {  // no loss, no gradient: nothing to read
    if (grad) {
      P zero;
#pragma unroll
      for (int j = 0; j < kWidth; ++j) zero.v[j] = from_float<T>(0.0f);
      for (int i = threadIdx.x; i < packs; i += kThreads) xv[i] = zero;
    }
    if (threadIdx.x == 0) losses[row] = 0.0f;
    return;
  }
  const bool label_ok = label >= 0 && label < vocab;
  // Read before any thread of this block starts overwriting the row.
  const float target = (threadIdx.x == 0 && label_ok) ? to_float(x[label]) : 0.0f;

  float m = -INFINITY, s = 0.0f;
  for (int i = threadIdx.x; i < packs; i += kThreads) {
    const P p = xv[i];
    float local = -INFINITY;
#pragma unroll
    for (int j = 0; j < kWidth; ++j) {
      if (i * kWidth + j < vocab) local = fmaxf(local, to_float(p.v[j]));
    }
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kWidth; ++j) {
      if (i * kWidth + j < vocab) sum += __expf(to_float(p.v[j]) - local);
    }
    merge(m, s, local, sum);
  }
  // Block reduction: warps by shuffles, then the first warp over the warps' results.
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    merge(m, s, __shfl_xor_sync(0xffffffffu, m, offset), __shfl_xor_sync(0xffffffffu, s, offset));
  }
  __shared__ float warp_m[kWarps], warp_s[kWarps];
  __shared__ float row_lse;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) {
    warp_m[warp] = m;
    warp_s[warp] = s;
  }
  __syncthreads();
  if (warp == 0) {
    m = lane < kWarps ? warp_m[lane] : -INFINITY;
    s = lane < kWarps ? warp_s[lane] : 0.0f;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
      merge(m, s, __shfl_xor_sync(0xffffffffu, m, offset), __shfl_xor_sync(0xffffffffu, s, offset));
    }
    if (lane == 0) {
      const float lse = m + logf(s);
      row_lse = lse;
      losses[row] = label_ok ? w * (lse - target) : NAN;
    }
  }
  __syncthreads();
  if (!grad) return;
  const float lse = row_lse;
  for (int i = threadIdx.x; i < packs; i += kThreads) {
    P p = xv[i];
#pragma unroll
    for (int j = 0; j < kWidth; ++j) {
      const int col = i * kWidth + j;
      const float g =
          col < vocab ? w * (__expf(to_float(p.v[j]) - lse) - (col == label ? 1.0f : 0.0f)) : 0.0f;
      p.v[j] = from_float<T>(g);
    }
    xv[i] = p;
  }
}

template <typename T>
void launch(const CrossEntropyChunk& c, cudaStream_t stream) {
  constexpr int kVector = 16 / sizeof(T);
  const bool aligned = c.padded % kVector == 0 && c.ld % kVector == 0 &&
                       reinterpret_cast<uintptr_t>(c.logits) % 16 == 0;
  auto* logits = static_cast<T*>(c.logits);
  const auto vocab = static_cast<int>(c.vocab), padded = static_cast<int>(c.padded);
  const auto blocks = static_cast<unsigned>(c.rows);
  if (aligned) {
    softmax_cross_entropy_kernel<T, kVector><<<blocks, kThreads, 0, stream>>>(
        logits, c.ld, vocab, padded, c.labels, c.weights, c.losses, c.grad);
  } else {
    softmax_cross_entropy_kernel<T, 1><<<blocks, kThreads, 0, stream>>>(
        logits, c.ld, vocab, padded, c.labels, c.weights, c.losses, c.grad);
  }
}

}  // namespace

void softmax_cross_entropy(const CrossEntropyChunk& c, void* stream) {
  GPT2P_CHECK(c.rows >= 0 && c.vocab >= 1 && c.vocab <= c.padded && c.padded <= c.ld &&
                  c.padded < (int64_t{1} << 31) && c.rows < (int64_t{1} << 31),
              "softmax_cross_entropy: " << c.rows << " rows of " << c.padded << " columns (vocab "
                                        << c.vocab << ", row stride " << c.ld << ")",
              "pass 1 <= vocab <= padded <= ld < 2^31");
  if (c.rows == 0) return;
  auto* s = static_cast<cudaStream_t>(stream);
  if (c.type == ElementType::kBFloat16) {
    launch<__nv_bfloat16>(c, s);
  } else {
    launch<float>(c, s);
  }
  const cudaError_t err = cudaGetLastError();
  GPT2P_CHECK(err == cudaSuccess,
              "softmax_cross_entropy: kernel launch failed: " << cudaGetErrorString(err),
              "check that the GPU is healthy and the build targets its architecture "
              "(CMAKE_CUDA_ARCHITECTURES)");
}

}  // namespace gpt2p::kernels
