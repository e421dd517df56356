// kernels/layer_norm.h. Forward: one block per row; each thread keeps its columns of y in
// registers (up to kMaxPacks vectors of 4, or scalars on the unaligned path), so the row is read
// once and the variance is a true second pass over y - mean. Backward: each block takes a fixed
// range of rows, one at a time, with the same columns in the same threads for every row, so the
// threads sum dgamma and dbeta of their columns in registers and the block writes one slice of
// partial sums; a second kernel adds the slices in a fixed order.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "element.cuh"
#include "gpt2p/core/error.h"
#include "gpt2p/kernels/layer_norm.h"

namespace gpt2p::kernels {
namespace {

// Threads of a row's block: the vector path spreads at most 256 threads over a row (8 vectors of
// 4 each for 8192 columns), the scalar path at most 1024 (8 scalars each).
constexpr int kMaxPacks = 8;
template <int kWidth>
constexpr int kMaxThreads = kWidth == 1 ? 1024 : 256;

// Backward blocks: at least kMinRowsPerPartial rows each and at most kMaxPartials blocks, so the
// workspace stays a small fraction of the gradient and its reduction is cheap.
constexpr int64_t kMaxPartials = 1024;
constexpr int64_t kMinRowsPerPartial = 8;

// The reduction of the partial sums: a block of kReduceCols columns x kReduceSplit threads over
// the partials of each column.
constexpr int kReduceCols = 32;
constexpr int kReduceSplit = 16;

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

// x and y are not __restrict__: y may be x (the residual add in place). A thread reads its
// elements of x before it writes the same elements of y.
template <typename TDelta, typename TOut, int kWidth, int kPacks>
__global__ void __launch_bounds__(kMaxThreads<kWidth>)
    add_layer_norm_forward_kernel(const float* x, const TDelta* __restrict__ delta,
                                  const float* __restrict__ gamma, const float* __restrict__ beta,
                                  float* y, TOut* __restrict__ out, float* __restrict__ mean,
                                  float* __restrict__ rstd, int cols, float eps) {
  const int packs = cols / kWidth;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * packs;
  __shared__ float2 shared[32];

  float v[kPacks][kWidth];
  float sum = 0.0f;
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int i = pack_index(k);
#pragma unroll
    for (int j = 0; j < kWidth; ++j) v[k][j] = 0.0f;
    if (i >= packs) continue;
    load<kWidth>(x + base * kWidth, i, v[k]);
    if (delta != nullptr) {
      float d[kWidth];
      load<kWidth>(delta + base * kWidth, i, d);
#pragma unroll
      for (int j = 0; j < kWidth; ++j) v[k][j] += d[j];
      store<kWidth>(y + base * kWidth, i, v[k]);
    }
#pragma unroll
    for (int j = 0; j < kWidth; ++j) sum += v[k][j];
  }
  const float mu = block_sum(sum, shared) / static_cast<float>(cols);

  float squares = 0.0f;
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    if (pack_index(k) >= packs) continue;
#pragma unroll
    for (int j = 0; j < kWidth; ++j) {
      const float d = v[k][j] - mu;
      squares += d * d;
    }
  }
  const float var = block_sum(squares, shared) / static_cast<float>(cols);
  const float rs = rsqrtf(var + eps);
  if (threadIdx.x == 0) {
    mean[blockIdx.x] = mu;
    rstd[blockIdx.x] = rs;
  }

#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int i = pack_index(k);
    if (i >= packs) continue;
    float g[kWidth], b[kWidth], o[kWidth];
    load<kWidth>(gamma, i, g);
    load<kWidth>(beta, i, b);
#pragma unroll
    for (int j = 0; j < kWidth; ++j) o[j] = (v[k][j] - mu) * rs * g[j] + b[j];
    store<kWidth>(out + base * kWidth, i, o);
  }
}

// dresidual and dy are not __restrict__: dy may be dresidual. partials is [2, num_partials, cols]:
// this block's dgamma sums in slice blockIdx.x, its dbeta sums in slice num_partials + blockIdx.x.
template <typename TOut, int kWidth, int kPacks>
__global__ void __launch_bounds__(kMaxThreads<kWidth>)
    add_layer_norm_backward_kernel(const TOut* __restrict__ dout, const float* __restrict__ y,
                                   const float* __restrict__ mean, const float* __restrict__ rstd,
                                   const float* __restrict__ gamma, const float* dresidual,
                                   float* dy, float* __restrict__ partials, int64_t rows, int cols,
                                   int64_t rows_per_block, int64_t num_partials) {
  const int packs = cols / kWidth;
  __shared__ float2 shared[32];

  float dgamma[kPacks][kWidth], dbeta[kPacks][kWidth];
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
#pragma unroll
    for (int j = 0; j < kWidth; ++j) dgamma[k][j] = dbeta[k][j] = 0.0f;
  }

  const int64_t first = static_cast<int64_t>(blockIdx.x) * rows_per_block;
  const int64_t last = first + rows_per_block < rows ? first + rows_per_block : rows;
  for (int64_t row = first; row < last; ++row) {
    const int64_t offset = row * cols;
    const float mu = mean[row], rs = rstd[row];
    float xhat[kPacks][kWidth], g[kPacks][kWidth];
    float sum_g = 0.0f, sum_gx = 0.0f;
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int i = pack_index(k);
#pragma unroll
      for (int j = 0; j < kWidth; ++j) xhat[k][j] = g[k][j] = 0.0f;
      if (i >= packs) continue;
      float yv[kWidth], d[kWidth], w[kWidth];
      load<kWidth>(y + offset, i, yv);
      load<kWidth>(dout + offset, i, d);
      load<kWidth>(gamma, i, w);
#pragma unroll
      for (int j = 0; j < kWidth; ++j) {
        xhat[k][j] = (yv[j] - mu) * rs;
        g[k][j] = d[j] * w[j];
        dgamma[k][j] += d[j] * xhat[k][j];
        dbeta[k][j] += d[j];
        sum_g += g[k][j];
        sum_gx += g[k][j] * xhat[k][j];
      }
    }
    const float2 sums = block_sum(make_float2(sum_g, sum_gx), shared);
    const float mean_g = sums.x / static_cast<float>(cols);
    const float mean_gx = sums.y / static_cast<float>(cols);
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int i = pack_index(k);
      if (i >= packs) continue;
      float r[kWidth];
#pragma unroll
      for (int j = 0; j < kWidth; ++j) r[j] = rs * (g[k][j] - mean_g - xhat[k][j] * mean_gx);
      if (dresidual != nullptr) {
        float extra[kWidth];
        load<kWidth>(dresidual + offset, i, extra);
#pragma unroll
        for (int j = 0; j < kWidth; ++j) r[j] += extra[j];
      }
      store<kWidth>(dy + offset, i, r);
    }
  }

  float* partial_dgamma = partials + static_cast<int64_t>(blockIdx.x) * cols;
  float* partial_dbeta = partials + (num_partials + blockIdx.x) * cols;
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int i = pack_index(k);
    if (i >= packs) continue;
    store<kWidth>(partial_dgamma, i, dgamma[k]);
    store<kWidth>(partial_dbeta, i, dbeta[k]);
  }
}

// dgamma (blockIdx.y 0) or dbeta (1) of kReduceCols columns: thread (c, s) adds partials s,
// s + kReduceSplit, ... of column c in that order, then thread (c, 0) adds the kReduceSplit sums
// in order. With no partials (no rows) the results are zeros.
__global__ void __launch_bounds__(kReduceCols* kReduceSplit)
    reduce_partials_kernel(const float* __restrict__ partials, float* __restrict__ dgamma,
                           float* __restrict__ dbeta, int64_t num_partials, int cols) {
  __shared__ float sums[kReduceSplit][kReduceCols + 1];
  const int col = static_cast<int>(blockIdx.x * kReduceCols + threadIdx.x);
  const float* p = partials + blockIdx.y * num_partials * cols;
  float s = 0.0f;
  if (col < cols) {
    for (int64_t q = threadIdx.y; q < num_partials; q += kReduceSplit) s += p[q * cols + col];
  }
  sums[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y != 0 || col >= cols) return;
  float total = 0.0f;
#pragma unroll
  for (int r = 0; r < kReduceSplit; ++r) total += sums[r][threadIdx.x];
  (blockIdx.y == 0 ? dgamma : dbeta)[col] = total;
}

int64_t rows_per_partial(int64_t rows) {
  return std::max(kMinRowsPerPartial, (rows + kMaxPartials - 1) / kMaxPartials);
}

int64_t num_partials(int64_t rows) {
  if (rows <= 0) return 0;
  const int64_t per = rows_per_partial(rows);
  return (rows + per - 1) / per;
}

// Vectors per thread (1, 2, 4 or 8) and threads (a multiple of 32) for a row of `packs` vectors.
struct RowShape {
  int packs_per_thread = 1;
  int threads = 32;
};

RowShape row_shape(int packs, int max_threads) {
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

bool aligned(const void* p, size_t bytes) {
  return p == nullptr || reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

size_t element_size(ElementType type) { return type == ElementType::kBFloat16 ? 2 : 4; }

void check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  GPT2P_CHECK(err == cudaSuccess, what << ": kernel launch failed: " << cudaGetErrorString(err),
              "check that the GPU is healthy and the build targets its architecture "
              "(CMAKE_CUDA_ARCHITECTURES)");
}

void check_shape(const char* what, int64_t rows, int64_t cols) {
  GPT2P_CHECK(rows >= 0 && rows < (int64_t{1} << 31) && cols >= 1 && cols <= kLayerNormMaxCols,
              what << ": " << rows << " rows of " << cols << " columns",
              "pass 0 <= rows < 2^31 and 1 <= columns <= " << kLayerNormMaxCols);
}

}  // namespace

int64_t add_layer_norm_workspace(int64_t rows, int64_t cols) {
  return 2 * num_partials(rows) * std::max<int64_t>(cols, 0);
}

void add_layer_norm_forward(const AddLayerNormForward& a, void* stream) {
  check_shape("add_layer_norm_forward", a.rows, a.cols);
  GPT2P_CHECK(a.x != nullptr && a.gamma != nullptr && a.beta != nullptr && a.out != nullptr &&
                  a.mean != nullptr && a.rstd != nullptr && (a.delta == nullptr || a.y != nullptr),
              "add_layer_norm_forward: a required pointer is null",
              "pass x, gamma, beta, out, mean and rstd, and y whenever delta is set");
  if (a.rows == 0) return;
  const size_t delta_bytes = element_size(a.delta_type), out_bytes = element_size(a.out_type);
  const bool vector = a.cols % 4 == 0 && aligned(a.x, 16) && aligned(a.gamma, 16) &&
                      aligned(a.beta, 16) && aligned(a.delta, 4 * delta_bytes) &&
                      (a.delta == nullptr || aligned(a.y, 16)) && aligned(a.out, 4 * out_bytes);
  auto* s = static_cast<cudaStream_t>(stream);
  const int cols = static_cast<int>(a.cols);
  const auto blocks = static_cast<unsigned>(a.rows);
  auto launch = [&](auto width) {
    constexpr int kWidth = decltype(width)::value;
    const RowShape shape = row_shape(cols / kWidth, kMaxThreads<kWidth>);
    with_type(a.delta_type, [&](auto delta_tag) {
      using TDelta = typename decltype(delta_tag)::type;
      with_type(a.out_type, [&](auto out_tag) {
        using TOut = typename decltype(out_tag)::type;
        with_packs(shape.packs_per_thread, [&](auto packs) {
          constexpr int kPacks = decltype(packs)::value;
          add_layer_norm_forward_kernel<TDelta, TOut, kWidth, kPacks>
              <<<blocks, shape.threads, 0, s>>>(a.x, static_cast<const TDelta*>(a.delta), a.gamma,
                                                a.beta, a.y, static_cast<TOut*>(a.out), a.mean,
                                                a.rstd, cols, a.eps);
        });
      });
    });
  };
  if (vector) {
    launch(std::integral_constant<int, 4>{});
  } else {
    launch(std::integral_constant<int, 1>{});
  }
  check_launch("add_layer_norm_forward");
}

void add_layer_norm_backward(const AddLayerNormBackward& a, void* stream) {
  check_shape("add_layer_norm_backward", a.rows, a.cols);
  const int64_t partials = num_partials(a.rows);
  GPT2P_CHECK(a.dout != nullptr && a.y != nullptr && a.mean != nullptr && a.rstd != nullptr &&
                  a.gamma != nullptr && a.dy != nullptr && a.dgamma != nullptr &&
                  a.dbeta != nullptr && (a.workspace != nullptr || partials == 0),
              "add_layer_norm_backward: a required pointer is null",
              "pass dout, y, mean, rstd, gamma, dy, dgamma, dbeta and the workspace");
  GPT2P_CHECK(aligned(a.workspace, 16), "add_layer_norm_backward: workspace is not 16-byte aligned",
              "allocate it with cudaMalloc or torch");
  auto* s = static_cast<cudaStream_t>(stream);
  const int cols = static_cast<int>(a.cols);
  if (partials > 0) {
    const bool vector = a.cols % 4 == 0 && aligned(a.dout, 4 * element_size(a.dout_type)) &&
                        aligned(a.y, 16) && aligned(a.gamma, 16) && aligned(a.dresidual, 16) &&
                        aligned(a.dy, 16);
    const int64_t per = rows_per_partial(a.rows);
    auto launch = [&](auto width) {
      constexpr int kWidth = decltype(width)::value;
      const RowShape shape = row_shape(cols / kWidth, kMaxThreads<kWidth>);
      with_type(a.dout_type, [&](auto dout_tag) {
        using TOut = typename decltype(dout_tag)::type;
        with_packs(shape.packs_per_thread, [&](auto packs) {
          constexpr int kPacks = decltype(packs)::value;
          add_layer_norm_backward_kernel<TOut, kWidth, kPacks>
              <<<static_cast<unsigned>(partials), shape.threads, 0, s>>>(
                  static_cast<const TOut*>(a.dout), a.y, a.mean, a.rstd, a.gamma, a.dresidual, a.dy,
                  a.workspace, a.rows, cols, per, partials);
        });
      });
    };
    if (vector) {
      launch(std::integral_constant<int, 4>{});
    } else {
      launch(std::integral_constant<int, 1>{});
    }
    check_launch("add_layer_norm_backward");
  }
  const dim3 grid(static_cast<unsigned>((cols + kReduceCols - 1) / kReduceCols), 2);
  const dim3 block(kReduceCols, kReduceSplit);
  reduce_partials_kernel<<<grid, block, 0, s>>>(a.workspace, a.dgamma, a.dbeta, partials, cols);
  check_launch("add_layer_norm_backward (dgamma, dbeta)");
}

}  // namespace gpt2p::kernels
