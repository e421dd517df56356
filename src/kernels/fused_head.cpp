#include "gpt2p/kernels/fused_head.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cublas_v2.h>

#include "gpt2p/core/error.h"
#include "gpt2p/kernels/cross_entropy.h"

namespace gpt2p::kernels {

torch::Tensor softmax_cross_entropy_(const torch::Tensor& logits, const torch::Tensor& labels,
                                     const torch::Tensor& weights, int64_t vocab, bool grad) {
  GPT2P_CHECK(
      logits.is_cuda() && logits.dim() == 2 && logits.stride(1) == 1 &&
          (logits.scalar_type() == torch::kBFloat16 || logits.scalar_type() == torch::kFloat32),
      "softmax_cross_entropy_: logits " << logits.sizes() << " " << logits.scalar_type() << " on "
                                        << logits.device(),
      "pass CUDA logits [rows, columns] in bfloat16 or float32 with contiguous rows");
  const c10::cuda::CUDAGuard guard(logits.device());
  const int64_t rows = logits.size(0);
  GPT2P_CHECK(labels.numel() == rows && weights.numel() == rows,
              "softmax_cross_entropy_: " << labels.numel() << " labels and " << weights.numel()
                                         << " weights for " << rows << " rows",
              "pass one label and one weight per row");
  const auto device_labels = labels.to(logits.device(), torch::kInt64).contiguous();
  const auto device_weights = weights.to(logits.device(), torch::kFloat32).contiguous();
  auto losses = torch::empty({rows}, logits.options().dtype(torch::kFloat32));
  CrossEntropyChunk chunk;
  chunk.logits = logits.data_ptr();
  chunk.type =
      logits.scalar_type() == torch::kBFloat16 ? ElementType::kBFloat16 : ElementType::kFloat32;
  chunk.rows = rows;
  chunk.ld = rows > 1 ? logits.stride(0) : logits.size(1);
  chunk.vocab = vocab;
  chunk.padded = logits.size(1);
  chunk.labels = device_labels.data_ptr<int64_t>();
  chunk.weights = device_weights.data_ptr<float>();
  chunk.losses = losses.data_ptr<float>();
  chunk.grad = grad;
  softmax_cross_entropy(chunk, at::cuda::getCurrentCUDAStream(logits.get_device()).stream());
  return losses;
}

void add_matmul_tn(const torch::Tensor& out, const torch::Tensor& a, const torch::Tensor& b,
                   bool add) {
  GPT2P_CHECK(a.is_cuda() && a.dim() == 2 && b.dim() == 2 && out.dim() == 2 &&
                  a.size(0) == b.size(0) && out.size(0) == a.size(1) && out.size(1) == b.size(1) &&
                  a.scalar_type() == b.scalar_type() && out.scalar_type() == torch::kFloat32 &&
                  a.is_contiguous() && b.is_contiguous() && out.is_contiguous(),
              "add_matmul_tn: out " << out.sizes() << " " << out.scalar_type() << " += a^T b for a "
                                    << a.sizes() << " " << a.scalar_type() << ", b " << b.sizes()
                                    << " " << b.scalar_type(),
              "pass contiguous a [k, m], b [k, n] of one type and a float32 out [m, n]");
  const c10::cuda::CUDAGuard guard(a.device());
  const auto k = static_cast<int>(a.size(0)), m = static_cast<int>(a.size(1)),
             n = static_cast<int>(b.size(1));
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (!add) out.zero_();
    return;
  }
  // Column-major view: out^T [n, m] += b^T [n, k] * a [k, m], i.e. B_c (n x k, ld n) times
  // A_c^T where A_c = a^T is m x k with ld m.
  const bool bf16 = a.scalar_type() == torch::kBFloat16;
  const cudaDataType_t in_type = bf16 ? CUDA_R_16BF : CUDA_R_32F;
  const cublasComputeType_t compute = !bf16 && at::globalContext().allowTF32CuBLAS()
                                          ? CUBLAS_COMPUTE_32F_FAST_TF32
                                          : CUBLAS_COMPUTE_32F;
  const float alpha = 1.0f, beta = add ? 1.0f : 0.0f;
  cublasHandle_t handle = at::cuda::getCurrentCUDABlasHandle();
  const cublasStatus_t status = cublasGemmEx(
      handle, CUBLAS_OP_N, CUBLAS_OP_T, n, m, k, &alpha, b.data_ptr(), in_type, n, a.data_ptr(),
      in_type, m, &beta, out.data_ptr(), CUDA_R_32F, n, compute, CUBLAS_GEMM_DEFAULT);
  GPT2P_CHECK(status == CUBLAS_STATUS_SUCCESS,
              "add_matmul_tn: cublasGemmEx failed with status "
                  << static_cast<int>(status) << " (" << m << " x " << n << " x " << k << ")",
              "check that the GPU is healthy; report the shapes if it is");
}

}  // namespace gpt2p::kernels
