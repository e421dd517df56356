#include "gpt2p/kernels/fused_mlp.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "gpt2p/compat/device.h"
#include "gpt2p/core/error.h"
#include "gpt2p/kernels/fused_linear.h"
#include "lt_gemm.h"

namespace gpt2p::kernels {

bool linear_gelu(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                 torch::Tensor& pre, torch::Tensor& h) {
  GPT2P_CHECK(x.is_cuda() && x.dim() == 2 && w.dim() == 2 && b.dim() == 1 &&
                  x.size(1) == w.size(1) && b.size(0) == w.size(0) &&
                  x.scalar_type() == w.scalar_type() && b.scalar_type() == x.scalar_type() &&
                  x.is_contiguous() && w.is_contiguous() && b.is_contiguous(),
              "linear_gelu: x " << x.sizes() << " " << x.scalar_type() << ", w " << w.sizes() << " "
                                << w.scalar_type() << ", b " << b.sizes() << " " << b.scalar_type(),
              "pass contiguous CUDA x [n, in], w [hidden, in] and b [hidden] of one type");
  const int64_t n = x.size(0), in = x.size(1), hidden = w.size(0);
  pre = torch::empty({n, hidden}, x.options());
  h = torch::empty({n, hidden}, x.options());
  if (n == 0) return true;
  // Column-major: h^T [hidden, n] = (w as stored: in x hidden, transposed) * (x as stored: in x n).
  auto g = detail::lt_gemm_into(h, x.scalar_type(), {w.data_ptr(), in, hidden, in, true},
                                {x.data_ptr(), in, n, in, false});
  g.epilogue = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  g.bias = b.data_ptr();
  g.bias_type = g.d_type;
  g.aux = pre.data_ptr();
  g.aux_ld = hidden;
  return detail::lt_matmul(g, x.device());
}

bool matmul_dgelu(const torch::Tensor& dy, const torch::Tensor& w, const torch::Tensor& pre,
                  torch::Tensor& dpre) {
  GPT2P_CHECK(
      dy.is_cuda() && dy.dim() == 2 && w.dim() == 2 && pre.dim() == 2 && dy.size(1) == w.size(0) &&
          pre.size(0) == dy.size(0) && pre.size(1) == w.size(1) &&
          dy.scalar_type() == w.scalar_type() && pre.scalar_type() == dy.scalar_type() &&
          dy.is_contiguous() && w.is_contiguous() && pre.is_contiguous(),
      "matmul_dgelu: dy " << dy.sizes() << " " << dy.scalar_type() << ", w " << w.sizes() << " "
                          << w.scalar_type() << ", pre " << pre.sizes() << " " << pre.scalar_type(),
      "pass contiguous CUDA dy [n, out], w [out, hidden] and pre [n, hidden] of one type");
  const int64_t n = dy.size(0), out = dy.size(1), hidden = w.size(1);
  dpre = torch::empty({n, hidden}, dy.options());
  if (n == 0) return true;
  // Column-major: dpre^T [hidden, n] = (w as stored: hidden x out) * (dy as stored: out x n).
  auto g = detail::lt_gemm_into(dpre, dy.scalar_type(), {w.data_ptr(), hidden, out, hidden, false},
                                {dy.data_ptr(), out, n, out, false});
  g.epilogue = CUBLASLT_EPILOGUE_DGELU;
  g.aux = const_cast<void*>(pre.data_ptr());  // read only by DGELU
  g.aux_ld = hidden;
  return detail::lt_matmul(g, dy.device());
}

namespace {

class FusedMlp : public torch::autograd::Function<FusedMlp> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& w_fc, const torch::Tensor& b_fc,
                               const torch::Tensor& w_proj, const torch::Tensor& b_proj,
                               bool accumulate_grad) {
    const auto dtype = compat::autocast_dtype(x.device(), w_fc.scalar_type());
    const auto x2 = x.to(dtype).reshape({-1, x.size(-1)}).contiguous();
    // Once per step when a compat::AutocastCacheScope is open (every micro-batch shares the copy;
    // the biases' too).
    const auto wfc = compat::cached_cast(w_fc, dtype).contiguous();
    const auto wproj = compat::cached_cast(w_proj, dtype).contiguous();
    const auto bfc = compat::cached_cast(b_fc, dtype).contiguous();
    torch::Tensor pre, h;
    if (!linear_gelu(x2, wfc, bfc, pre, h)) {
      pre = torch::linear(x2, wfc, bfc);
      h = torch::gelu(pre, "tanh");
    }
    auto y = torch::linear(h, wproj, compat::cached_cast(b_proj, dtype));
    ctx->save_for_backward({x2, wfc, pre, h, wproj});
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["p_dtypes"] = std::vector<int64_t>{
        static_cast<int64_t>(w_fc.scalar_type()), static_cast<int64_t>(b_fc.scalar_type()),
        static_cast<int64_t>(w_proj.scalar_type()), static_cast<int64_t>(b_proj.scalar_type())};
    // The weights themselves (leaves), whose .grad backward adds into.
    if (accumulate_grad) ctx->saved_data["accumulate_into"] = std::vector<at::Tensor>{w_fc, w_proj};
    auto shape = x.sizes().vec();
    shape.back() = w_proj.size(0);
    return y.view(shape);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &x2 = saved[0], &wfc = saved[1], &pre = saved[2], &h = saved[3], &wproj = saved[4];
    const auto x_dtype = static_cast<torch::ScalarType>(ctx->saved_data["x_dtype"].toInt());
    const auto dy = grads[0].to(h.scalar_type()).reshape({-1, wproj.size(0)}).contiguous();
    torch::Tensor dw_proj, db_proj, dw_fc, db_fc, dpre;
    torch::Tensor into_fc, into_proj;
    if (const auto it = ctx->saved_data.find("accumulate_into"); it != ctx->saved_data.end()) {
      const auto weights = it->second.toTensorVector();
      into_fc = weights[0];
      into_proj = weights[1];
    }
    weight_and_bias_grads(dy, h, into_proj, dw_proj, db_proj);
    if (!matmul_dgelu(dy, wproj, pre, dpre)) dpre = at::gelu_backward(dy.mm(wproj), pre, "tanh");
    weight_and_bias_grads(dpre, x2, into_fc, dw_fc, db_fc);
    auto shape = grads[0].sizes().vec();
    shape.back() = wfc.size(1);
    const auto dx = dpre.mm(wfc).to(x_dtype).view(shape);
    // The parameters' gradients in their own types.
    const auto types = ctx->saved_data["p_dtypes"].toIntVector();
    const auto as = [&](const torch::Tensor& g, size_t i) {
      return g.defined() ? g.to(static_cast<torch::ScalarType>(types[i])) : g;
    };
    // One per argument of forward; none for the flag.
    return {dx, as(dw_fc, 0), as(db_fc, 1), as(dw_proj, 2), as(db_proj, 3), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor mlp(const torch::Tensor& x, const torch::Tensor& w_fc, const torch::Tensor& b_fc,
                  const torch::Tensor& w_proj, const torch::Tensor& b_proj, bool accumulate_grad) {
  GPT2P_CHECK(x.is_cuda() && w_fc.is_cuda() && w_proj.is_cuda() && b_fc.defined() &&
                  b_proj.defined() && w_fc.dim() == 2 && w_proj.dim() == 2 &&
                  x.size(-1) == w_fc.size(1) && w_proj.size(1) == w_fc.size(0),
              "kernels::mlp: x " << x.sizes() << " on " << x.device() << ", w_fc " << w_fc.sizes()
                                 << ", w_proj " << w_proj.sizes()
                                 << (b_fc.defined() && b_proj.defined() ? "" : ", a bias missing"),
              "pass CUDA tensors x [..., in], w_fc [hidden, in], w_proj [out, hidden] and both "
              "biases; use torch::linear and torch::gelu otherwise");
  return FusedMlp::apply(x, w_fc, b_fc, w_proj, b_proj, accumulate_grad);
}

namespace {
std::atomic<int> gelu_epilogue{-1};  // -1: not yet read from the environment
}  // namespace

bool gelu_epilogue_enabled() {
  int on = gelu_epilogue.load();
  if (on < 0) {
    const char* v = std::getenv("GPT2P_GELU_EPILOGUE");
    int expected = -1;
    gelu_epilogue.compare_exchange_strong(expected, v == nullptr || std::strcmp(v, "0") != 0);
    on = gelu_epilogue.load();
  }
  return on == 1;
}

void set_gelu_epilogue(bool on) { gelu_epilogue.store(on ? 1 : 0); }

}  // namespace gpt2p::kernels
