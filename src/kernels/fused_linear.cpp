#include "gpt2p/kernels/fused_linear.h"

#include <cstdint>

#include "gpt2p/compat/device.h"
#include "gpt2p/compat/grad_into.h"
#include "gpt2p/core/error.h"
#include "lt_gemm.h"

namespace gpt2p::kernels {

namespace {

// Contiguous CUDA dy [n, out] and x [n, in] of one type (bf16, fp16 or fp32), or throws.
void check_operands(const char* what, const torch::Tensor& dy, const torch::Tensor& x) {
  GPT2P_CHECK(dy.is_cuda() && dy.dim() == 2 && x.dim() == 2 && dy.size(0) == x.size(0) &&
                  dy.scalar_type() == x.scalar_type() && dy.is_contiguous() && x.is_contiguous() &&
                  (dy.scalar_type() == torch::kBFloat16 || dy.scalar_type() == torch::kHalf ||
                   dy.scalar_type() == torch::kFloat32),
              what << ": dy " << dy.sizes() << " " << dy.scalar_type() << ", x " << x.sizes() << " "
                   << x.scalar_type(),
              "pass contiguous CUDA dy [n, out] and x [n, in] of one type (bf16, fp16 or fp32)");
}

// dw = dy^T x (beta 0) or dw += dy^T x (beta 1), dw float32 [out, in] and contiguous, and db = the
// column sums of dy (a new float32 [out]), in one cuBLASLt GEMM whose epilogue reduces dy's rows.
bool weight_grad_gemm(const torch::Tensor& dy, const torch::Tensor& x, torch::Tensor& dw,
                      torch::Tensor& db, float beta) {
  const int64_t n = x.size(0), in = x.size(1), out = dy.size(1);
  db = torch::empty({out}, x.options().dtype(torch::kFloat32));
  if (n == 0) {
    if (beta == 0.0f) dw.zero_();
    db.zero_();
    return true;
  }
  // Column-major: dw^T [in, out] = x^T [in, n] * dy [n, out], i.e. A = x as stored (in x n,
  // ld in), B = dy as stored (out x n, ld out) transposed; the epilogue reduces op(B) over k = n.
  auto g = detail::lt_gemm_into(dw, x.scalar_type(), {x.data_ptr(), in, n, in, false},
                                {dy.data_ptr(), out, n, out, true});
  g.epilogue = CUBLASLT_EPILOGUE_BGRADB;
  g.bias = db.data_ptr();
  g.bias_type = CUDA_R_32F;
  g.beta = beta;
  return detail::lt_matmul(g, x.device());
}

}  // namespace

bool linear_weight_grads(const torch::Tensor& dy, const torch::Tensor& x, torch::Tensor& dw,
                         torch::Tensor& db) {
  check_operands("linear_weight_grads", dy, x);
  dw = torch::empty({dy.size(1), x.size(1)}, x.options().dtype(torch::kFloat32));
  return weight_grad_gemm(dy, x, dw, db, 0.0f);
}

void weight_and_bias_grads(const torch::Tensor& dy, const torch::Tensor& x, torch::Tensor& dw,
                           torch::Tensor& db) {
  if (linear_weight_grads(dy, x, dw, db)) return;
  dw = dy.t().mm(x).to(torch::kFloat32);
  db = dy.sum(0, /*keepdim=*/false, torch::kFloat32);
}

bool add_linear_weight_grads(const torch::Tensor& dy, const torch::Tensor& x, torch::Tensor& grad,
                             torch::Tensor& db) {
  check_operands("add_linear_weight_grads", dy, x);
  GPT2P_CHECK(grad.scalar_type() == torch::kFloat32 && grad.is_contiguous() && grad.dim() == 2 &&
                  grad.size(0) == dy.size(1) && grad.size(1) == x.size(1) &&
                  grad.device() == dy.device(),
              "add_linear_weight_grads: grad " << grad.sizes() << " " << grad.scalar_type()
                                               << " for dy " << dy.sizes() << ", x " << x.sizes(),
              "pass a contiguous float32 grad [out, in] on dy's device");
  return weight_grad_gemm(dy, x, grad, db, 1.0f);
}

void weight_and_bias_grads(const torch::Tensor& dy, const torch::Tensor& x,
                           const torch::Tensor& accumulate_into, torch::Tensor& dw,
                           torch::Tensor& db) {
  torch::Tensor grad = compat::grad_to_add_into(accumulate_into, dy.device());
  if (grad.defined() && add_linear_weight_grads(dy, x, grad, db)) {
    dw = torch::Tensor();
    return;
  }
  weight_and_bias_grads(dy, x, dw, db);
}

namespace {

class FusedLinear : public torch::autograd::Function<FusedLinear> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const torch::Tensor& bias,
                               bool accumulate_grad) {
    // Autocast would cast the operands to its type; do it here, so backward sees the same operands.
    const auto dtype = compat::autocast_dtype(x.device(), weight.scalar_type());
    const auto xc = x.to(dtype).contiguous();
    // Once per step when a compat::AutocastCacheScope is open (every micro-batch shares the copy;
    // the bias's too, one kernel fewer per micro-batch).
    const auto wc = compat::cached_cast(weight, dtype);
    ctx->save_for_backward({xc, wc});
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["w_dtype"] = static_cast<int64_t>(weight.scalar_type());
    ctx->saved_data["b_dtype"] = static_cast<int64_t>(bias.scalar_type());
    // The weight itself (a leaf), whose .grad backward adds into.
    if (accumulate_grad) ctx->saved_data["accumulate_into"] = weight;
    return torch::linear(xc, wc, compat::cached_cast(bias, dtype));
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
    const auto into = ctx->saved_data.find("accumulate_into");
    weight_and_bias_grads(
        dy2, x2, into != ctx->saved_data.end() ? into->second.toTensor() : torch::Tensor(), dw, db);
    // One per argument of forward; none for the flag.
    return {dx, dw.defined() ? dw.to(w_dtype) : dw, db.to(b_dtype), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                     bool accumulate_grad) {
  GPT2P_CHECK(x.is_cuda() && weight.is_cuda() && bias.defined(),
              "kernels::linear: x on " << x.device() << ", weight on " << weight.device()
                                       << (bias.defined() ? "" : ", no bias"),
              "use torch::linear for CPU tensors and layers without a bias");
  return FusedLinear::apply(x, weight, bias, accumulate_grad);
}

}  // namespace gpt2p::kernels
