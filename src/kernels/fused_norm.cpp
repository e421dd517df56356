#include "gpt2p/kernels/fused_norm.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <sstream>
#include <string>

#include "gpt2p/compat/grad_into.h"
#include "gpt2p/core/error.h"
#include "gpt2p/kernels/layer_norm.h"

namespace gpt2p::kernels {
namespace {

// "[3, 37, 768] Float on cuda:0", or "undefined": for messages (sizes() of an undefined tensor
// would throw).
std::string describe(const torch::Tensor& t) {
  if (!t.defined()) return "undefined";
  std::ostringstream os;
  os << t.sizes() << " " << t.scalar_type() << " on " << t.device();
  return os.str();
}

ElementType element_type(torch::ScalarType type) {
  return type == torch::kBFloat16 ? ElementType::kBFloat16 : ElementType::kFloat32;
}

bool float_or_bf16(torch::ScalarType type) {
  return type == torch::kFloat32 || type == torch::kBFloat16;
}

// t is a contiguous CUDA tensor of `type` on `device`.
bool cuda_tensor(const torch::Tensor& t, torch::ScalarType type, const torch::Device& device) {
  return t.defined() && t.is_cuda() && t.device() == device && t.scalar_type() == type &&
         t.is_contiguous();
}

// gamma or beta: float32 [cols] on device.
void check_param(const char* fn, const char* name, const torch::Tensor& p, int64_t cols,
                 const torch::Device& device) {
  GPT2P_CHECK(
      cuda_tensor(p, torch::kFloat32, device) && p.dim() == 1 && p.size(0) == cols,
      fn << ": " << name << " " << describe(p) << " for rows of " << cols << " on " << device,
      "pass a contiguous float32 [" << cols << "] tensor on the same device");
}

// Columns of the rows of t [..., C], checked against the kernels' limit.
int64_t row_width(const char* fn, const char* name, const torch::Tensor& t) {
  const int64_t cols = t.size(-1);
  GPT2P_CHECK(cols >= 1 && cols <= kLayerNormMaxCols,
              fn << ": " << name << " " << describe(t) << " has rows of " << cols << " columns",
              "normalise rows of 1 to " << kLayerNormMaxCols << " columns");
  return cols;
}

}  // namespace

NormResult add_layer_norm_forward(const torch::Tensor& x, const torch::Tensor& delta,
                                  const torch::Tensor& gamma, const torch::Tensor& beta, double eps,
                                  torch::ScalarType out_type) {
  constexpr const char* kFn = "add_layer_norm_forward";
  GPT2P_CHECK(x.defined() && x.is_cuda() && x.scalar_type() == torch::kFloat32 && x.dim() >= 1 &&
                  x.is_contiguous(),
              kFn << ": x " << describe(x), "pass a contiguous float32 CUDA tensor [..., C]");
  const torch::Device device = x.device();
  const int64_t cols = row_width(kFn, "x", x);
  GPT2P_CHECK(!delta.defined() || (delta.is_cuda() && delta.device() == device &&
                                   float_or_bf16(delta.scalar_type()) && delta.is_contiguous() &&
                                   delta.sizes() == x.sizes()),
              kFn << ": delta " << describe(delta) << " for x " << describe(x),
              "pass a contiguous float32 or bfloat16 delta of x's shape on x's device, or none");
  check_param(kFn, "gamma", gamma, cols, device);
  check_param(kFn, "beta", beta, cols, device);
  GPT2P_CHECK(float_or_bf16(out_type), kFn << ": output type " << out_type,
              "ask for bfloat16 or float32");
  const c10::cuda::CUDAGuard guard(device);
  const int64_t rows = x.numel() / cols;
  NormResult r;
  r.y = delta.defined() ? torch::empty(x.sizes(), x.options()) : x;
  r.out = torch::empty(x.sizes(), x.options().dtype(out_type));
  r.mean = torch::empty({rows}, x.options());
  r.rstd = torch::empty({rows}, x.options());
  AddLayerNormForward args;
  args.x = x.data_ptr<float>();
  if (delta.defined()) {
    args.delta = delta.data_ptr();
    args.delta_type = element_type(delta.scalar_type());
    args.y = r.y.data_ptr<float>();
  }
  args.gamma = gamma.data_ptr<float>();
  args.beta = beta.data_ptr<float>();
  args.out = r.out.data_ptr();
  args.out_type = element_type(out_type);
  args.mean = r.mean.data_ptr<float>();
  args.rstd = r.rstd.data_ptr<float>();
  args.rows = rows;
  args.cols = cols;
  args.eps = static_cast<float>(eps);
  kernels::add_layer_norm_forward(args, at::cuda::getCurrentCUDAStream(device.index()).stream());
  return r;
}

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> add_layer_norm_backward(
    const torch::Tensor& dout, const torch::Tensor& y, const torch::Tensor& mean,
    const torch::Tensor& rstd, const torch::Tensor& gamma, const torch::Tensor& dresidual,
    const torch::Tensor& into_dgamma, const torch::Tensor& into_dbeta) {
  constexpr const char* kFn = "add_layer_norm_backward";
  GPT2P_CHECK(y.defined() && y.is_cuda() && y.scalar_type() == torch::kFloat32 && y.dim() >= 1 &&
                  y.is_contiguous(),
              kFn << ": y " << describe(y),
              "pass the y that add_layer_norm_forward returned (contiguous float32 CUDA)");
  const torch::Device device = y.device();
  const int64_t cols = row_width(kFn, "y", y);
  const int64_t rows = y.numel() / cols;
  GPT2P_CHECK(dout.defined() && dout.is_cuda() && dout.device() == device &&
                  float_or_bf16(dout.scalar_type()) && dout.is_contiguous() &&
                  dout.sizes() == y.sizes(),
              kFn << ": dout " << describe(dout) << " for y " << describe(y),
              "pass a contiguous float32 or bfloat16 gradient of y's shape on y's device");
  GPT2P_CHECK(cuda_tensor(mean, torch::kFloat32, device) &&
                  cuda_tensor(rstd, torch::kFloat32, device) && mean.numel() == rows &&
                  rstd.numel() == rows,
              kFn << ": mean " << describe(mean) << " and rstd " << describe(rstd) << " for "
                  << rows << " rows",
              "pass the mean and rstd that add_layer_norm_forward returned for this y");
  check_param(kFn, "gamma", gamma, cols, device);
  GPT2P_CHECK(!dresidual.defined() || (cuda_tensor(dresidual, torch::kFloat32, device) &&
                                       dresidual.sizes() == y.sizes()),
              kFn << ": dresidual " << describe(dresidual) << " for y " << describe(y),
              "pass a contiguous float32 gradient of y's shape on y's device, or none");
  const bool into = into_dgamma.defined() || into_dbeta.defined();
  if (into) {
    check_param(kFn, "into_dgamma", into_dgamma, cols, device);
    check_param(kFn, "into_dbeta", into_dbeta, cols, device);
  }
  const c10::cuda::CUDAGuard guard(device);
  auto dy = torch::empty(y.sizes(), y.options());
  auto dgamma = into ? into_dgamma : torch::empty({cols}, y.options());
  auto dbeta = into ? into_dbeta : torch::empty({cols}, y.options());
  const auto workspace = torch::empty({add_layer_norm_workspace(rows, cols)}, y.options());
  AddLayerNormBackward args;
  args.dout = dout.data_ptr();
  args.dout_type = element_type(dout.scalar_type());
  args.y = y.data_ptr<float>();
  args.mean = mean.data_ptr<float>();
  args.rstd = rstd.data_ptr<float>();
  args.gamma = gamma.data_ptr<float>();
  args.dresidual = dresidual.defined() ? dresidual.data_ptr<float>() : nullptr;
  args.dy = dy.data_ptr<float>();
  args.dgamma = dgamma.data_ptr<float>();
  args.dbeta = dbeta.data_ptr<float>();
  args.workspace = workspace.numel() > 0 ? workspace.data_ptr<float>() : nullptr;
  args.rows = rows;
  args.cols = cols;
  args.accumulate = into;
  kernels::add_layer_norm_backward(args, at::cuda::getCurrentCUDAStream(device.index()).stream());
  if (into) return {dy, torch::Tensor(), torch::Tensor()};
  return {dy, dgamma, dbeta};
}

namespace {

// The autograd ops: AddLayerNormFunction with a delta, LayerNormFunction without (autograd's
// functions take no undefined tensor inputs). Each saves y (x itself without delta), mean, rstd
// and gamma. Gradients that do not arrive stay undefined (no materialised zeros): without a
// gradient for out the LayerNorm part is skipped, without one for y nothing is added to it.
// With `accumulate` the parameters themselves (leaves), whose .grad backward adds into.
torch::autograd::variable_list save(torch::autograd::AutogradContext* ctx, const NormResult& r,
                                    const torch::Tensor& gamma, const torch::Tensor& gamma_leaf,
                                    const torch::Tensor& beta_leaf, bool accumulate) {
  ctx->set_materialize_grads(false);
  ctx->save_for_backward({r.y, r.mean, r.rstd, gamma});
  if (accumulate) {
    ctx->saved_data["gamma"] = gamma_leaf;
    ctx->saved_data["beta"] = beta_leaf;
  }
  return {r.y, r.out};
}

// The .grad of the leaf saved under `key` when backward can add into it, else undefined.
torch::Tensor saved_grad_to_add_into(torch::autograd::AutogradContext* ctx, const char* key,
                                     const torch::Device& device) {
  const auto it = ctx->saved_data.find(key);
  if (it == ctx->saved_data.end()) return {};
  return compat::grad_to_add_into(it->second.toTensor(), device);
}

// d loss / d y (undefined when no gradient arrived at all), dgamma and dbeta.
struct NormGrads {
  torch::Tensor dy, dgamma, dbeta;
};
NormGrads norm_backward(torch::autograd::AutogradContext* ctx,
                        const torch::autograd::variable_list& grads) {
  const auto saved = ctx->get_saved_variables();
  torch::Tensor grad_y = grads[0];
  if (grad_y.defined()) grad_y = grad_y.to(torch::kFloat32).contiguous();
  NormGrads g;
  g.dy = grad_y;  // no gradient for out: d loss / d y is grad_y alone
  if (grads[1].defined()) {
    auto into_dgamma = saved_grad_to_add_into(ctx, "gamma", saved[3].device());
    auto into_dbeta = saved_grad_to_add_into(ctx, "beta", saved[3].device());
    if (!into_dgamma.defined() || !into_dbeta.defined()) {
      into_dgamma = torch::Tensor();
      into_dbeta = torch::Tensor();
    }
    std::tie(g.dy, g.dgamma, g.dbeta) =
        add_layer_norm_backward(grads[1].contiguous(), saved[0], saved[1], saved[2], saved[3],
                                grad_y, into_dgamma, into_dbeta);
  }
  return g;
}

class AddLayerNormFunction : public torch::autograd::Function<AddLayerNormFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const torch::Tensor& x, const torch::Tensor& delta,
                                                const torch::Tensor& gamma,
                                                const torch::Tensor& beta, double eps,
                                                torch::ScalarType out_type, bool accumulate) {
    const auto g = gamma.contiguous();
    ctx->saved_data["delta_type"] = static_cast<int64_t>(delta.scalar_type());
    return save(ctx,
                add_layer_norm_forward(x.contiguous(), delta.contiguous(), g, beta.contiguous(),
                                       eps, out_type),
                g, gamma, beta, accumulate);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto g = norm_backward(ctx, grads);
    torch::Tensor dx, ddelta;
    if (ctx->needs_input_grad(0)) dx = g.dy;
    if (ctx->needs_input_grad(1) && g.dy.defined()) {
      ddelta = g.dy.to(static_cast<torch::ScalarType>(ctx->saved_data["delta_type"].toInt()));
    }
    return {dx, ddelta, g.dgamma, g.dbeta, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

class LayerNormFunction : public torch::autograd::Function<LayerNormFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const torch::Tensor& x, const torch::Tensor& gamma,
                                                const torch::Tensor& beta, double eps,
                                                torch::ScalarType out_type, bool accumulate) {
    const auto g = gamma.contiguous();
    return save(ctx,
                add_layer_norm_forward(x.contiguous(), torch::Tensor(), g, beta.contiguous(), eps,
                                       out_type),
                g, gamma, beta, accumulate);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto g = norm_backward(ctx, grads);
    return {g.dy, g.dgamma, g.dbeta, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

std::vector<torch::Tensor> add_layer_norm(const torch::Tensor& x, const torch::Tensor& delta,
                                          const torch::Tensor& gamma, const torch::Tensor& beta,
                                          double eps, torch::ScalarType out_type,
                                          bool accumulate_grad) {
  if (!delta.defined()) {
    return LayerNormFunction::apply(x, gamma, beta, eps, out_type, accumulate_grad);
  }
  return AddLayerNormFunction::apply(x, delta, gamma, beta, eps, out_type, accumulate_grad);
}

}  // namespace gpt2p::kernels
