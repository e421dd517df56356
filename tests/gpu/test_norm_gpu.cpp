// The residual add + LayerNorm kernels (kernels/fused_norm.h) against ATen in float64: the
// forward's y, out, mean and rstd, and the gradients of x, delta, gamma and beta through the
// autograd op against autograd through x + delta and torch::layer_norm. float32 results must
// agree to float rounding (1e-5 of the largest entry); a bfloat16 out or delta gradient within
// bfloat16's rounding (8 bits of mantissa: 2^-8 of the largest entry, 1e-2 stated).
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <optional>
#include <vector>

#include "gpt2p/compat/device.h"
#include "gpt2p/core/error.h"
#include "gpt2p/kernels/fused_norm.h"
#include "gpt2p/kernels/layer_norm.h"
#include "support/gpu_compare.h"

namespace gpt2p {
namespace {

const torch::Device kGpu(torch::kCUDA, 0);
constexpr double kEps = 1e-5;
constexpr double kFloatTol = 1e-5;
constexpr double kBf16Tol = 1e-2;

using gpt2p::testing::rel_diff;

// Inputs of one case: x with rows of varied mean and scale, delta of `delta_type` (none when
// nullopt), gamma near 1 and beta near 0.
struct Inputs {
  torch::Tensor x, delta, gamma, beta;
};
Inputs make_inputs(const std::vector<int64_t>& shape, std::optional<torch::ScalarType> delta_type,
                   uint64_t seed) {
  torch::manual_seed(seed);
  const auto opts = torch::TensorOptions().device(kGpu);
  const int64_t cols = shape.back();
  Inputs in;
  auto row_shape = shape;
  row_shape.back() = 1;
  in.x = torch::randn(shape, opts) * (torch::rand(row_shape, opts) * 3 + 0.5) +
         torch::randn(row_shape, opts) * 4;
  if (delta_type) in.delta = torch::randn(shape, opts).to(*delta_type);
  in.gamma = 1 + 0.2 * torch::randn({cols}, opts);
  in.beta = 0.2 * torch::randn({cols}, opts);
  return in;
}

// The forward's contract in float64.
kernels::NormResult reference(const Inputs& in) {
  const auto y = in.delta.defined() ? in.x.to(torch::kFloat64) + in.delta.to(torch::kFloat64)
                                    : in.x.to(torch::kFloat64);
  const int64_t cols = y.size(-1);
  kernels::NormResult r;
  r.y = y;
  r.out =
      torch::layer_norm(y, {cols}, in.gamma.to(torch::kFloat64), in.beta.to(torch::kFloat64), kEps);
  const auto rows = y.reshape({-1, cols});
  r.mean = rows.mean(1);
  r.rstd = 1 / torch::sqrt((rows - r.mean.unsqueeze(1)).pow(2).mean(1) + kEps);
  return r;
}

void check_forward(const std::vector<int64_t>& shape, std::optional<torch::ScalarType> delta_type,
                   torch::ScalarType out_type) {
  const auto in = make_inputs(shape, delta_type, 1);
  const auto want = reference(in);
  const auto got =
      kernels::add_layer_norm_forward(in.x, in.delta, in.gamma, in.beta, kEps, out_type);
  const auto where = ::testing::Message()
                     << torch::IntArrayRef(shape) << " delta "
                     << (delta_type ? c10::toString(*delta_type) : "none") << " out " << out_type;
  ASSERT_EQ(got.out.scalar_type(), out_type) << where;
  ASSERT_EQ(got.out.sizes(), in.x.sizes()) << where;
  ASSERT_EQ(got.y.sizes(), in.x.sizes()) << where;
  if (!delta_type) {
    EXPECT_TRUE(got.y.is_same(in.x)) << where;  // y is x itself
  } else {
    EXPECT_LT(rel_diff(got.y, want.y), kFloatTol) << where;
  }
  EXPECT_LT(rel_diff(got.mean, want.mean), kFloatTol) << where;
  EXPECT_LT(rel_diff(got.rstd, want.rstd), kFloatTol) << where;
  EXPECT_LT(rel_diff(got.out, want.out), out_type == torch::kBFloat16 ? kBf16Tol : kFloatTol)
      << where;
}

TEST(AddLayerNormForward, MatchesFloat64) {
  GPT2P_REQUIRE_GPU();
  for (const auto& shape : {std::vector<int64_t>{3, 37, 768}, std::vector<int64_t>{2, 5, 64}}) {
    for (auto out_type : {torch::kFloat32, torch::kBFloat16}) {
      check_forward(shape, std::nullopt, out_type);
      check_forward(shape, torch::kFloat32, out_type);
      check_forward(shape, torch::kBFloat16, out_type);
    }
  }
}

TEST(AddLayerNormForward, ScalarPathAndWidthLimits) {
  GPT2P_REQUIRE_GPU();
  for (auto out_type : {torch::kFloat32, torch::kBFloat16}) {
    check_forward({7, 50}, torch::kBFloat16, out_type);    // not a multiple of 4: scalar path
    check_forward({4, 3}, std::nullopt, out_type);         // narrower than a warp
    check_forward({5, 8192}, torch::kFloat32, out_type);   // widest rows, vector path
    check_forward({3, 8190}, torch::kBFloat16, out_type);  // widest rows, scalar path
  }
}

TEST(AddLayerNormForward, UnalignedRowsTakeTheScalarPath) {
  GPT2P_REQUIRE_GPU();
  // Contiguous rows of 64 floats starting one float past a 16-byte boundary.
  const auto in = make_inputs({6, 64}, torch::kFloat32, 2);
  Inputs shifted = in;
  const auto opts = torch::TensorOptions().device(kGpu);
  shifted.x = torch::empty({in.x.numel() + 1}, opts).narrow(0, 1, in.x.numel()).view(in.x.sizes());
  shifted.x.copy_(in.x);
  ASSERT_TRUE(shifted.x.is_contiguous());
  const auto want = reference(in);
  const auto got = kernels::add_layer_norm_forward(shifted.x, shifted.delta, in.gamma, in.beta,
                                                   kEps, torch::kFloat32);
  EXPECT_LT(rel_diff(got.y, want.y), kFloatTol);
  EXPECT_LT(rel_diff(got.out, want.out), kFloatTol);
}

// Gradients through kernels::add_layer_norm against autograd through x + delta and
// torch::layer_norm in float64, with gradients arriving at both y and out.
void check_backward(const std::vector<int64_t>& shape, std::optional<torch::ScalarType> delta_type,
                    torch::ScalarType out_type) {
  const auto in = make_inputs(shape, delta_type, 3);
  const auto opts = torch::TensorOptions().device(kGpu);
  const auto grad_out = torch::randn(shape, opts).to(out_type);
  const auto grad_y = 0.5 * torch::randn(shape, opts);
  const auto where = ::testing::Message()
                     << torch::IntArrayRef(shape) << " delta "
                     << (delta_type ? c10::toString(*delta_type) : "none") << " out " << out_type;

  auto x = in.x.clone().requires_grad_(true), gamma = in.gamma.clone().requires_grad_(true),
       beta = in.beta.clone().requires_grad_(true);
  torch::Tensor delta;
  if (delta_type) delta = in.delta.clone().requires_grad_(true);
  const auto outs = kernels::add_layer_norm(x, delta, gamma, beta, kEps, out_type);
  ASSERT_EQ(outs.size(), 2u);
  torch::autograd::backward({outs[0], outs[1]}, {grad_y, grad_out});

  const auto x64 = in.x.to(torch::kFloat64).requires_grad_(true);
  const auto gamma64 = in.gamma.to(torch::kFloat64).requires_grad_(true);
  const auto beta64 = in.beta.to(torch::kFloat64).requires_grad_(true);
  torch::Tensor delta64, y64 = x64;
  if (delta_type) {
    delta64 = in.delta.to(torch::kFloat64).requires_grad_(true);
    y64 = x64 + delta64;
  }
  const auto out64 = torch::layer_norm(y64, {shape.back()}, gamma64, beta64, kEps);
  torch::autograd::backward({y64, out64},
                            {grad_y.to(torch::kFloat64), grad_out.to(torch::kFloat64)});

  EXPECT_LT(rel_diff(x.grad(), x64.grad()), kFloatTol) << where;
  EXPECT_LT(rel_diff(gamma.grad(), gamma64.grad()), kFloatTol) << where;
  EXPECT_LT(rel_diff(beta.grad(), beta64.grad()), kFloatTol) << where;
  if (delta_type) {
    ASSERT_EQ(delta.grad().scalar_type(), *delta_type) << where;
    EXPECT_LT(rel_diff(delta.grad(), delta64.grad()),
              *delta_type == torch::kBFloat16 ? kBf16Tol : kFloatTol)
        << where;
  }
}

TEST(AddLayerNormBackward, AutogradMatchesFloat64) {
  GPT2P_REQUIRE_GPU();
  for (const auto& shape : {std::vector<int64_t>{3, 37, 768}, std::vector<int64_t>{2, 5, 64}}) {
    for (auto out_type : {torch::kFloat32, torch::kBFloat16}) {
      check_backward(shape, std::nullopt, out_type);
      check_backward(shape, torch::kFloat32, out_type);
      check_backward(shape, torch::kBFloat16, out_type);
    }
  }
}

TEST(AddLayerNormBackward, ScalarPathManyBlocksAndWidthLimits) {
  GPT2P_REQUIRE_GPU();
  check_backward({7, 50}, torch::kBFloat16, torch::kBFloat16);  // scalar path
  check_backward({4, 3}, torch::kFloat32, torch::kFloat32);
  check_backward({1, 10001, 64}, torch::kBFloat16, torch::kBFloat16);  // 1001 blocks, last of 1 row
  check_backward({33, 8192}, torch::kFloat32, torch::kBFloat16);
  check_backward({17, 8190}, std::nullopt, torch::kFloat32);
}

// Two micro-batches with accumulate_grad and gamma's and beta's .grad allocated before (as a
// graphed pipeline stage keeps them): both gradients are added into those very tensors by the
// reduction kernel and equal what autograd adds up on the plain path; without a .grad (the first
// backward of a run) autograd gets the gradients as usual.
TEST(AddLayerNormBackward, AccumulatesTheParameterGradientsInPlace) {
  GPT2P_REQUIRE_GPU();
  const auto in = make_inputs({2, 40, 96}, torch::kBFloat16, 5);
  const auto opts = torch::TensorOptions().device(kGpu);
  const torch::Tensor ups[2] = {torch::randn({2, 40, 96}, opts), torch::randn({2, 40, 96}, opts)};
  torch::Tensor dgamma[2], dbeta[2];
  for (int i = 0; i < 2; ++i) {
    const bool accumulate = i == 1;
    auto gamma = in.gamma.clone().requires_grad_(true), beta = in.beta.clone().requires_grad_(true);
    if (accumulate) {
      gamma.mutable_grad() = torch::zeros_like(gamma);
      beta.mutable_grad() = torch::zeros_like(beta);
    }
    const auto before = accumulate ? gamma.grad().data_ptr() : nullptr;
    for (int mb = 0; mb < 2; ++mb) {
      const auto x = (in.x + mb).requires_grad_(true);
      const auto outs =
          kernels::add_layer_norm(x, in.delta, gamma, beta, kEps, torch::kBFloat16, accumulate);
      (outs[1].to(torch::kFloat32) * ups[mb]).sum().backward();
    }
    if (accumulate) {
      EXPECT_EQ(gamma.grad().data_ptr(), before) << "the same .grad, added into";
    }
    dgamma[i] = gamma.grad();
    dbeta[i] = beta.grad();
  }
  EXPECT_LT(rel_diff(dgamma[1], dgamma[0]), 1e-6);
  EXPECT_LT(rel_diff(dbeta[1], dbeta[0]), 1e-6);
  // No .grad yet: the gradients reach autograd.
  auto gamma = in.gamma.clone().requires_grad_(true), beta = in.beta.clone().requires_grad_(true);
  const auto outs =
      kernels::add_layer_norm(in.x, in.delta, gamma, beta, kEps, torch::kBFloat16, true);
  (outs[1].to(torch::kFloat32) * ups[0]).sum().backward();
  ASSERT_TRUE(gamma.grad().defined() && beta.grad().defined());
  EXPECT_GT(beta.grad().abs().sum().item<double>(), 0.0);
}

TEST(AddLayerNormBackward, DirectCallAddsTheResidualGradient) {
  GPT2P_REQUIRE_GPU();
  const auto in = make_inputs({9, 96}, torch::kFloat32, 4);
  const auto fwd =
      kernels::add_layer_norm_forward(in.x, in.delta, in.gamma, in.beta, kEps, torch::kFloat32);
  const auto opts = torch::TensorOptions().device(kGpu);
  const auto dout = torch::randn({9, 96}, opts), dres = torch::randn({9, 96}, opts);
  // The formula of kernels/layer_norm.h in float64 on the kernel's own y, mean and rstd.
  const auto y = fwd.y.to(torch::kFloat64), mean = fwd.mean.to(torch::kFloat64).unsqueeze(1),
             rstd = fwd.rstd.to(torch::kFloat64).unsqueeze(1);
  const auto xhat = (y - mean) * rstd, g = dout.to(torch::kFloat64) * in.gamma.to(torch::kFloat64);
  const auto want =
      rstd * (g - g.mean(1, true) - xhat * (g * xhat).mean(1, true)) + dres.to(torch::kFloat64);
  for (const bool with_residual : {false, true}) {
    const auto [dy, dgamma, dbeta] = kernels::add_layer_norm_backward(
        dout, fwd.y, fwd.mean, fwd.rstd, in.gamma, with_residual ? dres : torch::Tensor());
    EXPECT_LT(rel_diff(dy, with_residual ? want : want - dres.to(torch::kFloat64)), kFloatTol);
    EXPECT_LT(rel_diff(dgamma, (dout.to(torch::kFloat64) * xhat).sum(0)), kFloatTol);
    EXPECT_LT(rel_diff(dbeta, dout.to(torch::kFloat64).sum(0)), kFloatTol);
  }
}

TEST(AddLayerNormBackward, ParameterGradientsAreDeterministic) {
  GPT2P_REQUIRE_GPU();
  const auto in = make_inputs({4, 1024, 768}, torch::kBFloat16, 5);
  const auto fwd =
      kernels::add_layer_norm_forward(in.x, in.delta, in.gamma, in.beta, kEps, torch::kBFloat16);
  const auto dout =
      torch::randn({4, 1024, 768}, torch::TensorOptions().device(kGpu)).to(torch::kBFloat16);
  const auto first =
      kernels::add_layer_norm_backward(dout, fwd.y, fwd.mean, fwd.rstd, in.gamma, torch::Tensor());
  for (int i = 0; i < 3; ++i) {
    const auto again = kernels::add_layer_norm_backward(dout, fwd.y, fwd.mean, fwd.rstd, in.gamma,
                                                        torch::Tensor());
    EXPECT_TRUE(std::get<0>(again).equal(std::get<0>(first)));
    EXPECT_TRUE(std::get<1>(again).equal(std::get<1>(first)));
    EXPECT_TRUE(std::get<2>(again).equal(std::get<2>(first)));
  }
}

TEST(AddLayerNormAutograd, OneOutputUsedAtATime) {
  GPT2P_REQUIRE_GPU();
  const auto in = make_inputs({2, 5, 64}, torch::kBFloat16, 6);
  const auto opts = torch::TensorOptions().device(kGpu);
  const auto w = torch::randn({2, 5, 64}, opts);
  {  // Only y: its gradient passes to x and delta untouched; gamma and beta get none.
    auto x = in.x.clone().requires_grad_(true), delta = in.delta.clone().requires_grad_(true);
    auto gamma = in.gamma.clone().requires_grad_(true), beta = in.beta.clone().requires_grad_(true);
    const auto outs = kernels::add_layer_norm(x, delta, gamma, beta, kEps, torch::kBFloat16);
    (outs[0] * w).sum().backward();
    EXPECT_TRUE(x.grad().equal(w));
    EXPECT_TRUE(delta.grad().equal(w.to(torch::kBFloat16)));
    EXPECT_FALSE(gamma.grad().defined());
    EXPECT_FALSE(beta.grad().defined());
  }
  {  // Only out, no delta: x's gradient is LayerNorm's alone.
    auto x = in.x.clone().requires_grad_(true), gamma = in.gamma.clone().requires_grad_(true),
         beta = in.beta.clone().requires_grad_(true);
    const auto outs =
        kernels::add_layer_norm(x, torch::Tensor(), gamma, beta, kEps, torch::kFloat32);
    (outs[1] * w).sum().backward();
    const auto x64 = in.x.to(torch::kFloat64).requires_grad_(true);
    (torch::layer_norm(x64, {64}, in.gamma.to(torch::kFloat64), in.beta.to(torch::kFloat64), kEps) *
     w.to(torch::kFloat64))
        .sum()
        .backward();
    EXPECT_LT(rel_diff(x.grad(), x64.grad()), kFloatTol);
    EXPECT_LT(rel_diff(beta.grad(), w.sum(torch::IntArrayRef{0, 1})), kFloatTol);
  }
}

TEST(AddLayerNormAutograd, AutocastChangesNothing) {
  GPT2P_REQUIRE_GPU();
  // The op is outside autocast's lists: under bf16 autocast it computes exactly what it does
  // without it.
  const auto in = make_inputs({3, 37, 768}, torch::kBFloat16, 7);
  const auto grad_out =
      torch::randn({3, 37, 768}, torch::TensorOptions().device(kGpu)).to(torch::kBFloat16);
  torch::Tensor out[2], dx[2], dgamma[2];
  for (int i = 0; i < 2; ++i) {
    auto x = in.x.clone().requires_grad_(true), gamma = in.gamma.clone().requires_grad_(true);
    {
      compat::AutocastGuard autocast(kGpu, i == 1 ? torch::kBFloat16 : torch::kFloat32);
      out[i] = kernels::add_layer_norm(x, in.delta, gamma, in.beta, kEps, torch::kBFloat16)[1];
    }
    out[i].backward(grad_out);
    dx[i] = x.grad();
    dgamma[i] = gamma.grad();
  }
  EXPECT_TRUE(out[1].equal(out[0]));
  EXPECT_TRUE(dx[1].equal(dx[0]));
  EXPECT_TRUE(dgamma[1].equal(dgamma[0]));
}

TEST(AddLayerNormChecks, BadInputsFailWithAMessage) {
  const auto x = torch::randn({4, 64});
  const auto gamma = torch::ones({64}), beta = torch::zeros({64});
  // CPU tensors, checked before anything touches a GPU.
  EXPECT_THROW(
      kernels::add_layer_norm_forward(x, torch::Tensor(), gamma, beta, kEps, torch::kFloat32),
      Error);
  if (!torch::cuda::is_available()) return;
  const auto opts = torch::TensorOptions().device(kGpu);
  const auto xg = x.to(kGpu), gg = gamma.to(kGpu), bg = beta.to(kGpu);
  EXPECT_THROW(kernels::add_layer_norm_forward(xg, torch::randn({4, 32}, opts), gg, bg, kEps,
                                               torch::kFloat32),
               Error);  // delta of another shape
  EXPECT_THROW(kernels::add_layer_norm_forward(xg, torch::Tensor(), torch::ones({32}, opts), bg,
                                               kEps, torch::kFloat32),
               Error);  // gamma of another width
  EXPECT_THROW(kernels::add_layer_norm_forward(xg.t(), torch::Tensor(), torch::ones({4}, opts),
                                               torch::zeros({4}, opts), kEps, torch::kFloat32),
               Error);  // not contiguous
  EXPECT_THROW(kernels::add_layer_norm_forward(xg, torch::Tensor(), gg, bg, kEps, torch::kHalf),
               Error);  // no half output
  EXPECT_THROW(kernels::add_layer_norm_forward(torch::randn({2, 8200}, opts), torch::Tensor(),
                                               torch::ones({8200}, opts),
                                               torch::zeros({8200}, opts), kEps, torch::kFloat32),
               Error);  // wider than the kernels' limit
  const auto fwd =
      kernels::add_layer_norm_forward(xg, torch::Tensor(), gg, bg, kEps, torch::kFloat32);
  EXPECT_THROW(kernels::add_layer_norm_backward(torch::randn({4, 63}, opts), fwd.y, fwd.mean,
                                                fwd.rstd, gg, torch::Tensor()),
               Error);  // dout of another shape
  EXPECT_THROW(kernels::add_layer_norm_backward(fwd.out, fwd.y, fwd.mean.narrow(0, 0, 3), fwd.rstd,
                                                gg, torch::Tensor()),
               Error);  // mean of another length
}

TEST(AddLayerNormWorkspace, DependsOnlyOnTheShape) {
  EXPECT_EQ(kernels::add_layer_norm_workspace(0, 768), 0);
  EXPECT_EQ(kernels::add_layer_norm_workspace(1, 768), 2 * 768);         // one block
  EXPECT_EQ(kernels::add_layer_norm_workspace(111, 768), 2 * 56 * 768);  // 2 rows a block
  EXPECT_EQ(kernels::add_layer_norm_workspace(2048, 768), 2 * 1024 * 768);
  EXPECT_EQ(kernels::add_layer_norm_workspace(16384, 768), 2 * 1024 * 768);
  EXPECT_EQ(kernels::add_layer_norm_workspace(10001, 64), 2 * 1001 * 64);  // 10 rows a block
}

}  // namespace
}  // namespace gpt2p
