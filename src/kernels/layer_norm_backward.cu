// kernels/layer_norm.h, backward: each block takes a fixed range of rows, one at a time, with the
// same columns in the same threads for every row, so the threads sum dgamma and dbeta of their
// columns in registers and the block writes one slice of partial sums; a second kernel adds the
// slices in a fixed order.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "layer_norm.cuh"

namespace gpt2p::kernels {
namespace {

// Backward blocks: at least kMinRowsPerPartial rows each and at most kMaxPartials blocks, so the
// workspace stays a small fraction of the gradient and its reduction is cheap. A block runs its
// rows one after another, so few rows need many blocks: at 8 rows per block a pipeline
// micro-batch of 2 x 1024 tokens ran 256 blocks of one row's threads, at 3 times the time per row
// of 16 x 1024 tokens (one H200, GPT-2 124M).
constexpr int64_t kMaxPartials = 1024;
constexpr int64_t kMinRowsPerPartial = 2;

// The reduction of the partial sums: a block of kReduceCols columns x kReduceSplit threads over
// the partials of each column. At 1024 partials of 768 columns, 32 x 16 ran 48 blocks of 64
// dependent loads per thread, 3.9 us a call on an H100: 16 x 32 runs twice the blocks, and each
// thread's loads are unrolled so that several are in flight.
constexpr int kReduceCols = 16;
constexpr int kReduceSplit = 32;

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
// in order. With no partials (no rows) the results are zeros. With `accumulate` each result is
// added to what dgamma or dbeta hold.
__global__ void __launch_bounds__(kReduceCols* kReduceSplit)
    reduce_partials_kernel(const float* __restrict__ partials, float* __restrict__ dgamma,
                           float* __restrict__ dbeta, int64_t num_partials, int cols,
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
  float* out = blockIdx.y == 0 ? dgamma : dbeta;
  out[col] = accumulate ? out[col] + total : total;
}

int64_t rows_per_partial(int64_t rows) {
  return std::max(kMinRowsPerPartial, (rows + kMaxPartials - 1) / kMaxPartials);
}

int64_t num_partials(int64_t rows) {
  if (rows <= 0) return 0;
  const int64_t per = rows_per_partial(rows);
  return (rows + per - 1) / per;
}

}  // namespace

int64_t add_layer_norm_workspace(int64_t rows, int64_t cols) {
  return 2 * num_partials(rows) * std::max<int64_t>(cols, 0);
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
  reduce_partials_kernel<<<grid, block, 0, s>>>(a.workspace, a.dgamma, a.dbeta, partials, cols,
                                                a.accumulate);
  check_launch("add_layer_norm_backward (dgamma, dbeta)");
}

}  // namespace gpt2p::kernels
