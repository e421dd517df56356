// The second pass of a deterministic column reduction (layer_norm_backward.cu, column_sum.cu): the
// first kernel leaves one slice of per-column partial sums per block of rows, and this adds the
// slices of each column in a fixed order (nvcc only).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace gpt2p::kernels {

// A block of kReduceCols columns x kReduceSplit threads over the partials of each column. At 1024
// partials of 768 columns, 32 x 16 ran 48 blocks of 64 dependent loads per thread, 3.9 us a call
// on an H100: 16 x 32 runs twice the blocks, and each thread's loads are unrolled so that several
// are in flight.
inline constexpr int kReduceCols = 16;
inline constexpr int kReduceSplit = 32;

// Each file that includes this gets its own copy (no device linking).
namespace {

// Output blockIdx.y (out0, or out1 for 1) of kReduceCols columns, from partials [gridDim.y,
// num_partials, cols]: thread (c, s) adds partials s, s + kReduceSplit, ... of column c in that
// order, then thread (c, 0) adds the kReduceSplit sums in order. With no partials the results are
// zeros. With `accumulate` each result is added to what the output holds.
__global__ void __launch_bounds__(kReduceCols* kReduceSplit)
    reduce_partials_kernel(const float* __restrict__ partials, float* __restrict__ out0,
                           float* __restrict__ out1, int64_t num_partials, int cols,
                           bool accumulate) {
  __shared__ float sums[kReduceSplit][kReduceCols + 1];
  const int col = static_cast<int>(blockIdx.x * kReduceCols + threadIdx.x);
  const float* p = partials + blockIdx.y * num_partials * cols;
  float s = 0.0f;
  if (col < cols) {
#pragma unroll 8
    for (int64_t q = threadIdx.y; q < num_partials; q += kReduceSplit) s += p[q * cols + col];
  }
  sums[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y != 0 || col >= cols) return;
  float total = 0.0f;
#pragma unroll
  for (int r = 0; r < kReduceSplit; ++r) total += sums[r][threadIdx.x];
  float* out = blockIdx.y == 0 ? out0 : out1;
  out[col] = accumulate ? out[col] + total : total;
}

// out0 (and out1 when not null, from the next num_partials x cols slice) on `stream`.
void reduce_partials(const float* partials, float* out0, float* out1, int64_t num_partials,
                     int cols, bool accumulate, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((cols + kReduceCols - 1) / kReduceCols),
                  out1 == nullptr ? 1 : 2);
  const dim3 block(kReduceCols, kReduceSplit);
  reduce_partials_kernel<<<grid, block, 0, stream>>>(partials, out0, out1, num_partials, cols,
                                                     accumulate);
}

}  // namespace
}  // namespace gpt2p::kernels
