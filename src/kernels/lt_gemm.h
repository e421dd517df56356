// One cuBLASLt matmul with an epilogue, as the fused layers (fused_linear.cpp, fused_mlp.cpp) run
// them. Private to src/kernels.
//
// cuBLASLt is column-major: D [m, n] = alpha op(A) op(B) + beta D, op(A) [m, k], op(B) [k, n]. A
// row-major [r, c] tensor is the column-major [c, r] matrix with leading dimension c, so a
// row-major product Y [rows, out] = X [rows, in] W^T (W [out, in]) is D = Y with m = out,
// n = rows, k = in, A = W transposed (lda = in) and B = X (ldb = in).
#pragma once

#include <cublasLt.h>
#include <torch/torch.h>

#include <cstdint>

namespace gpt2p::kernels::detail {

struct LtOperand {
  const void* data = nullptr;
  int64_t rows = 0, cols = 0, ld = 0;  // as stored, column-major
  bool transposed = false;             // op(X) = X^T
};

struct LtGemm {
  LtOperand a, b;
  void* d = nullptr;
  int64_t d_rows = 0, d_cols = 0, ldd = 0;
  cudaDataType_t ab_type = CUDA_R_16BF;  // A and B
  cudaDataType_t d_type = CUDA_R_16BF;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  void* bias = nullptr;  // the bias (BIAS epilogues) or the bias gradient (BGRAD ones)
  cudaDataType_t bias_type = CUDA_R_32F;
  void* aux = nullptr;  // GELU's input, of D's type: written by GELU_AUX*, read by DGELU*
  int64_t aux_ld = 0;
  float beta = 0.0f;  // 1: D += op(A) op(B) (D is read as C)
};

// cuBLASLt's type for a bf16, fp16 or fp32 tensor.
cudaDataType_t lt_type(torch::ScalarType type);

// A product into `d`, a contiguous row-major [rows, cols] tensor (column-major cols x rows), from
// operands of type `operands`; float32 operands use TF32 where torch allows it. The caller adds the
// epilogue and its pointers.
LtGemm lt_gemm_into(const torch::Tensor& d, torch::ScalarType operands, const LtOperand& a,
                    const LtOperand& b);

// Runs `g` on `device`'s current stream. False, with D (and bias, aux) unwritten, when cuBLASLt
// has no algorithm for it (shapes, alignment, epilogue): the caller then takes the plain path.
// Errors other than "not supported" throw.
bool lt_matmul(const LtGemm& g, const torch::Device& device);

}  // namespace gpt2p::kernels::detail
