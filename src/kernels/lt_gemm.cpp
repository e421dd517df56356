#include "lt_gemm.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <array>
#include <map>
#include <mutex>

#include "gpt2p/core/error.h"

namespace gpt2p::kernels::detail {
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

template <typename T>
void set(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& value,
         const char* what) {
  check_lt(cublasLtMatmulDescSetAttribute(d, attr, &value, sizeof value), what);
}

// The heuristic's choice depends on the problem, not on the addresses beyond their alignment:
// asked once per problem, the host spends no time on it in later steps (a step runs the same
// few shapes hundreds of times).
using Key = std::array<int64_t, 20>;
struct Choice {
  bool found = false;
  cublasLtMatmulHeuristicResult_t result{};
};

}  // namespace

cudaDataType_t lt_type(torch::ScalarType type) {
  switch (type) {
    case torch::kBFloat16: return CUDA_R_16BF;
    case torch::kHalf: return CUDA_R_16F;
    case torch::kFloat32: return CUDA_R_32F;
    default: GPT2P_FAIL("cuBLASLt: no matmul for " << type, "pass bf16, fp16 or fp32 tensors");
  }
  return CUDA_R_32F;
}

LtGemm lt_gemm_into(const torch::Tensor& d, torch::ScalarType operands, const LtOperand& a,
                    const LtOperand& b) {
  LtGemm g;
  g.a = a;
  g.b = b;
  g.d = d.data_ptr();
  g.d_rows = d.size(1);
  g.d_cols = d.size(0);
  g.ldd = d.size(1);
  g.ab_type = lt_type(operands);
  g.d_type = lt_type(d.scalar_type());
  g.compute = operands == torch::kFloat32 && at::globalContext().allowTF32CuBLAS()
                  ? CUBLAS_COMPUTE_32F_FAST_TF32
                  : CUBLAS_COMPUTE_32F;
  return g;
}

bool lt_matmul(const LtGemm& g, const torch::Device& device) {
  // GELU's auxiliary matrix: 16-byte aligned, its leading dimension a multiple of 8.
  if (g.aux != nullptr && (alignment_of(g.aux) < 16 || g.aux_ld % 8 != 0)) return false;
  MatmulDesc desc;
  check_lt(cublasLtMatmulDescCreate(&desc.d, g.compute, CUDA_R_32F), "MatmulDescCreate");
  const cublasOperation_t op_a = g.a.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = g.b.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  set(desc.d, CUBLASLT_MATMUL_DESC_TRANSA, op_a, "TRANSA");
  set(desc.d, CUBLASLT_MATMUL_DESC_TRANSB, op_b, "TRANSB");
  if (g.epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
    set(desc.d, CUBLASLT_MATMUL_DESC_EPILOGUE, g.epilogue, "EPILOGUE");
  }
  if (g.bias != nullptr) {
    set(desc.d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias, "BIAS_POINTER");
    const int32_t bias_type = g.bias_type;
    set(desc.d, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bias_type, "BIAS_DATA_TYPE");
  }
  if (g.aux != nullptr) {
    set(desc.d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, g.aux, "EPILOGUE_AUX_POINTER");
    set(desc.d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, g.aux_ld, "EPILOGUE_AUX_LD");
  }
  Layout a, b, d;
  check_lt(cublasLtMatrixLayoutCreate(&a.l, g.ab_type, g.a.rows, g.a.cols, g.a.ld), "layout A");
  check_lt(cublasLtMatrixLayoutCreate(&b.l, g.ab_type, g.b.rows, g.b.cols, g.b.ld), "layout B");
  check_lt(cublasLtMatrixLayoutCreate(&d.l, g.d_type, g.d_rows, g.d_cols, g.ldd), "layout D");

  // Without these cuBLASLt assumes 256-byte operands; a view into a larger tensor may be less.
  const uint32_t align_a = alignment_of(g.a.data), align_b = alignment_of(g.b.data),
                 align_d = alignment_of(g.d);
  const Key key{g.a.rows, g.a.cols,  g.a.ld,     g.a.transposed,
                g.b.rows, g.b.cols,  g.b.ld,     g.b.transposed,
                g.d_rows, g.d_cols,  g.ldd,      g.ab_type,
                g.d_type, g.compute, g.epilogue, g.bias != nullptr ? g.bias_type : -1,
                g.aux_ld, align_a,   align_b,    align_d};
  static std::mutex mutex;
  static std::map<Key, Choice> choices;
  Choice choice;
  bool known = false;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = choices.find(key);
    if (it != choices.end()) {
      choice = it->second;
      known = true;
    }
  }
  const c10::cuda::CUDAGuard guard(device);
  auto handle = lt_handle();
  if (!known) {
    Preference pref;
    check_lt(cublasLtMatmulPreferenceCreate(&pref.p), "PreferenceCreate");
    const size_t workspace_bytes = kWorkspaceBytes;
    check_lt(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &workspace_bytes, sizeof workspace_bytes),
             "MAX_WORKSPACE_BYTES");
    const bool aligned =
        cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                             &align_a, sizeof align_a) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                             &align_b, sizeof align_b) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                             &align_d, sizeof align_d) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                             &align_d, sizeof align_d) == CUBLAS_STATUS_SUCCESS;
    int found = 0;
    choice.found =
        aligned &&
        cublasLtMatmulAlgoGetHeuristic(handle, desc.d, a.l, b.l, d.l, d.l, pref.p, 1,
                                       &choice.result, &found) == CUBLAS_STATUS_SUCCESS &&
        found > 0;
    std::lock_guard<std::mutex> lock(mutex);
    choices.emplace(key, choice);
  }
  if (!choice.found) return false;
  const auto workspace = torch::empty({static_cast<int64_t>(choice.result.workspaceSize)},
                                      torch::TensorOptions().device(device).dtype(torch::kUInt8));
  const float alpha = 1.0f;
  // A launch cuBLASLt refuses leaves D unwritten: the caller computes it the plain way.
  return cublasLtMatmul(handle, desc.d, &alpha, g.a.data, a.l, g.b.data, b.l, &g.beta, g.d, d.l,
                        g.d, d.l, &choice.result.algo,
                        workspace.numel() > 0 ? workspace.data_ptr() : nullptr,
                        choice.result.workspaceSize,
                        at::cuda::getCurrentCUDAStream(device.index())) == CUBLAS_STATUS_SUCCESS;
}

}  // namespace gpt2p::kernels::detail
