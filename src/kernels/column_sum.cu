// kernels/column_sum.h: each block sums a fixed range of rows of kLanes x kWidth columns, its
// kRowLanes row lanes each taking every kRowLanes-th row of the range in order, and writes one
// slice of partial sums (the lanes added in order); partials.cuh adds the slices in order.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "gpt2p/kernels/column_sum.h"
#include "layer_norm.cuh"  // load, with_type, aligned, check_launch
#include "partials.cuh"

namespace gpt2p::kernels {
namespace {

// A block: kLanes threads across the columns (one 16-byte vector each), kRowLanes down the rows.
constexpr int kLanes = 32;
constexpr int kRowLanes = 8;
// Row blocks: at least kMinRowsPerPartial rows each and at most kMaxPartials of them, so the
// workspace stays small next to the input: 2048 rows of 768 bfloat16 columns run 3 x 128 blocks,
// 16384 rows of 3072 run 12 x 128.
constexpr int64_t kMaxPartials = 128;
constexpr int64_t kMinRowsPerPartial = 16;

int64_t rows_per_partial(int64_t rows) {
  return std::max(kMinRowsPerPartial, (rows + kMaxPartials - 1) / kMaxPartials);
}

int64_t num_partials(int64_t rows) {
  if (rows <= 0) return 0;
  const int64_t per = rows_per_partial(rows);
  return (rows + per - 1) / per;
}

// partials [num_partials, cols]: this block's sums in slice blockIdx.y, columns blockIdx.x *
// kLanes * kWidth onwards.
template <typename T, int kWidth>
__global__ void __launch_bounds__(kLanes* kRowLanes)
    column_partials_kernel(const T* __restrict__ x, float* __restrict__ partials, int64_t rows,
                           int cols, int64_t rows_per_block) {
  __shared__ float sums[kRowLanes][kLanes * kWidth + 1];
  const int packs = cols / kWidth;
  const int pack = static_cast<int>(blockIdx.x) * kLanes + static_cast<int>(threadIdx.x);
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * rows_per_block;
  const int64_t end = begin + rows_per_block < rows ? begin + rows_per_block : rows;
  float acc[kWidth];
#pragma unroll
  for (int j = 0; j < kWidth; ++j) acc[j] = 0.0f;
  if (pack < packs) {
#pragma unroll 4
    for (int64_t r = begin + threadIdx.y; r < end; r += kRowLanes) {
      float v[kWidth];
      load<kWidth>(x + r * cols, pack, v);
#pragma unroll
      for (int j = 0; j < kWidth; ++j) acc[j] += v[j];
    }
  }
#pragma unroll
  for (int j = 0; j < kWidth; ++j) sums[threadIdx.y][threadIdx.x * kWidth + j] = acc[j];
  __syncthreads();
  // The row lanes' sums of each column, in lane order, by kLanes * kWidth threads of the block.
  const int t = static_cast<int>(threadIdx.y * kLanes + threadIdx.x);
  for (int c = t; c < kLanes * kWidth; c += kLanes * kRowLanes) {
    const int col = static_cast<int>(blockIdx.x) * kLanes * kWidth + c;
    if (col >= packs * kWidth) continue;
    float total = 0.0f;
#pragma unroll
    for (int l = 0; l < kRowLanes; ++l) total += sums[l][c];
    partials[static_cast<int64_t>(blockIdx.y) * cols + col] = total;
  }
}

}  // namespace

int64_t column_sums_workspace(int64_t rows, int64_t cols) {
  return num_partials(rows) * std::max<int64_t>(cols, 0);
}

void column_sums(const ColumnSums& a, void* stream) {
  GPT2P_CHECK(
      a.rows >= 0 && a.rows < (int64_t{1} << 31) && a.cols >= 1 && a.cols < (int64_t{1} << 31),
      "column_sums: " << a.rows << " rows of " << a.cols << " columns",
      "pass 0 <= rows < 2^31 and 1 <= columns < 2^31");
  const int64_t partials = num_partials(a.rows);
  GPT2P_CHECK(a.out != nullptr && (partials == 0 || (a.x != nullptr && a.workspace != nullptr)),
              "column_sums: a required pointer is null", "pass x, out and the workspace");
  auto* s = static_cast<cudaStream_t>(stream);
  const int cols = static_cast<int>(a.cols);
  if (partials > 0) {
    const int64_t per = rows_per_partial(a.rows);
    const int vector = 16 / static_cast<int>(element_size(a.type));
    const bool vectors = a.cols % vector == 0 && aligned(a.x, 16);
    with_type(a.type, [&](auto tag) {
      using T = typename decltype(tag)::type;
      auto launch = [&](auto width) {
        constexpr int kWidth = decltype(width)::value;
        const int packs = cols / kWidth;
        const dim3 grid(static_cast<unsigned>((packs + kLanes - 1) / kLanes),
                        static_cast<unsigned>(partials));
        column_partials_kernel<T, kWidth><<<grid, dim3(kLanes, kRowLanes), 0, s>>>(
            static_cast<const T*>(a.x), a.workspace, a.rows, cols, per);
      };
      if (!vectors) {
        launch(std::integral_constant<int, 1>{});
      } else if constexpr (std::is_same_v<T, float>) {
        launch(std::integral_constant<int, 4>{});
      } else {
        launch(std::integral_constant<int, 8>{});
      }
    });
    check_launch("column_sums");
  }
  reduce_partials(a.workspace, a.out, nullptr, partials, cols, a.accumulate, s);
  check_launch("column_sums (reduction)");
}

}  // namespace gpt2p::kernels
