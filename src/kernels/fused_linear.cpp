#include "gpt2p/kernels/fused_linear.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cublasLt.h>

#include <cstdint>
#include <memory>
#include <string>

#include "gpt2p/compat/device.h"
#include "gpt2p/core/error.h"

namespace gpt2p::kernels {
namespace {

void check_lt(cublasStatus_t status, const char* what) {
  GPT2P_CHECK(status == CUBLAS_STATUS_SUCCESS,
              "cuBLASLt " << what << " failed with status " << static_cast<int>(status),
              "check that the GPU is healthy; report the layer's shapes if it is");
}

// Owners of cuBLASLt's descriptors, destroyed on every path.
struct MatmulDesc {
  cublasLtMatmulDesc_t d = nullptr;
  ~MatmulDesc() {
    if (d) cublasLtMatmulDescDestroy(d);
  }
};
struct Layout {
  cublasLtMatrixLayout_t l = nullptr;
  ~Layout() {
    if (l) cublasLtMatrixLayoutDestroy(l);
  }
};
struct Preference {
  cublasLtMatmulPreference_t p = nullptr;
  ~Preference() {
    if (p) cublasLtMatmulPreferenceDestroy(p);
  }
};

constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // what cuBLAS itself reserves on Hopper

// The largest power of two up to 256 that divides the address: what cuBLASLt may assume of it.
uint32_t alignment_of(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 256;
  while (a > 1 && address % a != 0) a /= 2;
  return a;
}

// One cuBLASLt context for the process (a handle is not tied to a stream or a thread).
cublasLtHandle_t lt_handle() {
  static const cublasLtHandle_t handle = [] {
    cublasLtHandle_t h = nullptr;
    check_lt(cublasLtCreate(&h), "Create");
    return h;
  }();
  return handle;
}

}  // namespace

bool linear_weight_grads(const torch::Tensor& dy, const torch::Tensor& x, torch::Tensor& dw,
                         torch::Tensor& db) {
  GPT2P_CHECK(dy.is_cuda() && dy.dim() == 2 && x.dim() == 2 && dy.size(0) == x.size(0) &&
                  dy.scalar_type() == x.scalar_type() && dy.is_contiguous() && x.is_contiguous() &&
                  (dy.scalar_type() == torch::kBFloat16 || dy.scalar_type() == torch::kFloat32),
              "linear_weight_grads: dy " << dy.sizes() << " " << dy.scalar_type() << ", x "
                                         << x.sizes() << " " << x.scalar_type(),
              "pass contiguous CUDA dy [n, out] and x [n, in] of one type (bf16 or fp32)");
  const int64_t n = x.size(0), in = x.size(1), out = dy.size(1);
  dw = torch::empty({out, in}, x.options().dtype(torch::kFloat32));
  db = torch::empty({out}, x.options().dtype(torch::kFloat32));
  if (n == 0) {
    dw.zero_();
    db.zero_();
    return true;
  }
  const bool bf16 = x.scalar_type() == torch::kBFloat16;
  const cudaDataType_t in_type = bf16 ? CUDA_R_16BF : CUDA_R_32F;
  const cublasComputeType_t compute = !bf16 && at::globalContext().allowTF32CuBLAS()
                                          ? CUBLAS_COMPUTE_32F_FAST_TF32
                                          : CUBLAS_COMPUTE_32F;
  // Column-major: dw^T [in, out] = x^T [in, n] * dy [n, out], i.e. A = x as stored (in x n,
  // ld in), B = dy as stored (out x n, ld out) transposed; the epilogue reduces op(B) over k = n.
  MatmulDesc desc;
  check_lt(cublasLtMatmulDescCreate(&desc.d, compute, CUDA_R_32F), "MatmulDescCreate");
  const cublasOperation_t op_n = CUBLAS_OP_N, op_t = CUBLAS_OP_T;
  check_lt(cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_TRANSA, &op_n, sizeof op_n),
           "TRANSA");
  check_lt(cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_TRANSB, &op_t, sizeof op_t),
           "TRANSB");
  const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BGRADB;
  check_lt(cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                          sizeof epilogue),
           "EPILOGUE");
  void* bias = db.data_ptr();
  check_lt(
      cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias),
      "BIAS_POINTER");
  const int32_t bias_type = CUDA_R_32F;
  check_lt(cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                          sizeof bias_type),
           "BIAS_DATA_TYPE");
  Layout a, b, d;
  check_lt(cublasLtMatrixLayoutCreate(&a.l, in_type, in, n, in), "layout A");
  check_lt(cublasLtMatrixLayoutCreate(&b.l, in_type, out, n, out), "layout B");
  check_lt(cublasLtMatrixLayoutCreate(&d.l, CUDA_R_32F, in, out, in), "layout D");
  Preference pref;
  check_lt(cublasLtMatmulPreferenceCreate(&pref.p), "PreferenceCreate");
  const size_t workspace_bytes = kWorkspaceBytes;
  check_lt(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                &workspace_bytes, sizeof workspace_bytes),
           "MAX_WORKSPACE_BYTES");
  // Without these cuBLASLt assumes 256-byte operands; a view into a larger tensor may be less.
  const uint32_t align_a = alignment_of(x.data_ptr()), align_b = alignment_of(dy.data_ptr()),
                 align_d = alignment_of(dw.data_ptr());
  if (cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                           &align_a, sizeof align_a) != CUBLAS_STATUS_SUCCESS ||
      cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                           &align_b, sizeof align_b) != CUBLAS_STATUS_SUCCESS ||
      cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                           &align_d, sizeof align_d) != CUBLAS_STATUS_SUCCESS ||
      cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                           &align_d, sizeof align_d) != CUBLAS_STATUS_SUCCESS) {
    return false;
  }
  const c10::cuda::CUDAGuard guard(x.device());
  auto handle = lt_handle();
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  if (cublasLtMatmulAlgoGetHeuristic(handle, desc.d, a.l, b.l, d.l, d.l, pref.p, 1, &heuristic,
                                     &found) != CUBLAS_STATUS_SUCCESS ||
      found == 0) {
    return false;
  }
  const auto workspace = torch::empty({static_cast<int64_t>(heuristic.workspaceSize)},
                                      x.options().dtype(torch::kUInt8));
  const float alpha = 1.0f, beta = 0.0f;
  // A launch cuBLASLt refuses leaves dw and db unwritten: the caller computes them the plain way.
  return cublasLtMatmul(handle, desc.d, &alpha, x.data_ptr(), a.l, dy.data_ptr(), b.l, &beta,
                        dw.data_ptr(), d.l, dw.data_ptr(), d.l, &heuristic.algo,
                        workspace.numel() > 0 ? workspace.data_ptr() : nullptr,
                        heuristic.workspaceSize,
                        at::cuda::getCurrentCUDAStream(x.get_device())) == CUBLAS_STATUS_SUCCESS;
}

namespace {

class FusedLinear : public torch::autograd::Function<FusedLinear> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const torch::Tensor& bias) {
    // Autocast would cast the operands to its type; do it here, so backward sees the same operands.
    const auto dtype = compat::autocast_dtype(x.device(), weight.scalar_type());
    const auto xc = x.to(dtype).contiguous();
    // Once per step when a compat::AutocastCacheScope is open (every micro-batch shares the copy).
    const auto wc = compat::cached_cast(weight, dtype);
    ctx->save_for_backward({xc, wc});
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["w_dtype"] = static_cast<int64_t>(weight.scalar_type());
    ctx->saved_data["b_dtype"] = static_cast<int64_t>(bias.scalar_type());
    return torch::linear(xc, wc, bias.to(dtype));
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& xc = saved[0];
    const auto& wc = saved[1];
    const auto w_dtype = static_cast<torch::ScalarType>(ctx->saved_data["w_dtype"].toInt());
    const auto x_dtype = static_cast<torch::ScalarType>(ctx->saved_data["x_dtype"].toInt());
    const auto b_dtype = static_cast<torch::ScalarType>(ctx->saved_data["b_dtype"].toInt());
    const auto dy = grads[0].to(wc.scalar_type()).contiguous();
    const auto dy2 = dy.reshape({-1, dy.size(-1)});
    const auto x2 = xc.reshape({-1, xc.size(-1)});
    const auto dx = dy.matmul(wc).to(x_dtype);
    torch::Tensor dw, db;
    if (!linear_weight_grads(dy2, x2, dw, db)) {  // no cuBLASLt algorithm: the plain way
      dw = dy2.t().mm(x2).to(torch::kFloat32);
      db = dy2.sum(0, /*keepdim=*/false, torch::kFloat32);
    }
    return {dx, dw.to(w_dtype), db.to(b_dtype)};
  }
};

}  // namespace

torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& weight,
                     const torch::Tensor& bias) {
  GPT2P_CHECK(x.is_cuda() && weight.is_cuda() && bias.defined(),
              "kernels::linear: x on " << x.device() << ", weight on " << weight.device()
                                       << (bias.defined() ? "" : ", no bias"),
              "use torch::linear for CPU tensors and layers without a bias");
  return FusedLinear::apply(x, weight, bias);
}

}  // namespace gpt2p::kernels
