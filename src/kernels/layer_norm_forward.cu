// kernels/layer_norm.h, forward: one block per row; each thread keeps its columns of y in
// registers (up to kMaxPacks vectors of 4, or scalars on the unaligned path), so the row is read
// once and the variance is a true second pass over y - mean.
#include <type_traits>

#include "layer_norm.cuh"

namespace gpt2p::kernels {
namespace {

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

}  // namespace

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

}  // namespace gpt2p::kernels
