// GPT-2's MLP with the GELU in the GEMMs' epilogues (kernels/fused_mlp.h) against float64 and
// against the plain path (torch::linear, torch::gelu): each GEMM alone, then the whole layer's
// output and every gradient. The model-level comparisons (--kernels fused against reference) in
// test_kernels_gpu.cpp run it too, under bf16 autocast.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "gpt2p/compat/device.h"
#include "gpt2p/kernels/fused_mlp.h"
#include "gpt2p/model/gpt2.h"
#include "support/gpu_compare.h"
#include "support/small_model.h"

namespace gpt2p {
namespace {

const torch::Device kGpu(torch::kCUDA, 0);

using gpt2p::testing::rel_diff;

torch::Tensor f64(const torch::Tensor& t) { return t.to(torch::kFloat64); }

TEST(LinearGelu, OneGemmGivesThePreActivationAndTheGelu) {
  GPT2P_REQUIRE_GPU();
  torch::manual_seed(11);
  compat::set_strict_fp32(true);
  for (auto type : {torch::kBFloat16, torch::kFloat32}) {
    const auto opts = torch::TensorOptions().device(kGpu);
    const auto x = torch::randn({1000, 64}, opts).to(type),
               w = (torch::randn({256, 64}, opts) * 0.2).to(type),
               b = torch::randn({256}, opts).to(type);
    torch::Tensor pre, h;
    ASSERT_TRUE(kernels::linear_gelu(x, w, b, pre, h)) << "cuBLASLt has no algorithm, " << type;
    const auto want_pre = f64(x).mm(f64(w).t()) + f64(b);
    const double tol = type == torch::kFloat32 ? 1e-4 : 1e-2;
    EXPECT_EQ(h.scalar_type(), type);
    EXPECT_LT(rel_diff(pre, want_pre), tol) << type;
    // GELU of the pre-activation as stored (in the GEMM's type).
    EXPECT_LT(rel_diff(h, torch::gelu(f64(pre), "tanh")), tol) << type;
  }
}

TEST(MatmulDgelu, OneGemmGivesTheGradientThroughTheGelu) {
  GPT2P_REQUIRE_GPU();
  torch::manual_seed(12);
  compat::set_strict_fp32(true);
  for (auto type : {torch::kBFloat16, torch::kFloat32}) {
    const auto opts = torch::TensorOptions().device(kGpu);
    const auto dy = torch::randn({1000, 64}, opts).to(type),
               w = (torch::randn({64, 256}, opts) * 0.2).to(type),
               pre = torch::randn({1000, 256}, opts).to(type);
    torch::Tensor dpre;
    ASSERT_TRUE(kernels::matmul_dgelu(dy, w, pre, dpre)) << "cuBLASLt has no algorithm, " << type;
    const auto want = at::gelu_backward(f64(dy).mm(f64(w)), f64(pre), "tanh");
    EXPECT_EQ(dpre.scalar_type(), type);
    EXPECT_LT(rel_diff(dpre, want), type == torch::kFloat32 ? 1e-4 : 1e-2) << type;
  }
}

TEST(LinearGelu, NoRowsGiveEmptyResults) {
  GPT2P_REQUIRE_GPU();
  const auto opts = torch::TensorOptions().device(kGpu).dtype(torch::kBFloat16);
  torch::Tensor pre, h, dpre;
  EXPECT_TRUE(kernels::linear_gelu(torch::zeros({0, 64}, opts), torch::zeros({256, 64}, opts),
                                   torch::zeros({256}, opts), pre, h));
  EXPECT_EQ(h.sizes(), (std::vector<int64_t>{0, 256}));
  EXPECT_TRUE(kernels::matmul_dgelu(torch::zeros({0, 64}, opts), torch::zeros({64, 256}, opts),
                                    torch::zeros({0, 256}, opts), dpre));
  EXPECT_EQ(dpre.sizes(), (std::vector<int64_t>{0, 256}));
}

TEST(LinearGelu, RefusesMismatchedOperands) {
  GPT2P_REQUIRE_GPU();
  const auto opts = torch::TensorOptions().device(kGpu).dtype(torch::kBFloat16);
  torch::Tensor pre, h;
  EXPECT_THROW(kernels::linear_gelu(torch::zeros({8, 64}, opts), torch::zeros({256, 32}, opts),
                                    torch::zeros({256}, opts), pre, h),
               std::exception);
  EXPECT_THROW(kernels::linear_gelu(torch::zeros({8, 64}, opts),
                                    torch::zeros({256, 64}, opts.dtype(torch::kFloat32)),
                                    torch::zeros({256}, opts), pre, h),
               std::exception);
}

// kernels::mlp against c_proj(gelu(c_fc(x))) with torch's ops, under bf16 autocast (as the model
// runs it) and in float32: the output and the gradients of x and of all four parameters.
void check_mlp(bool bf16, double tol) {
  torch::manual_seed(13);
  const auto opts = torch::TensorOptions().device(kGpu);
  // 4 x 50 = 200 rows: not a multiple of the GEMMs' tiles.
  const auto x0 = torch::randn({4, 50, 64}, opts), wfc0 = torch::randn({256, 64}, opts) * 0.1,
             bfc0 = torch::randn({256}, opts) * 0.1, wproj0 = torch::randn({64, 256}, opts) * 0.1,
             bproj0 = torch::randn({64}, opts) * 0.1;
  const auto up = torch::randn({4, 50, 64}, opts);
  compat::set_strict_fp32(true);
  torch::Tensor y[2];
  std::vector<torch::Tensor> grads[2];
  for (int i = 0; i < 2; ++i) {
    auto x = x0.clone().requires_grad_(true), wfc = wfc0.clone().requires_grad_(true),
         bfc = bfc0.clone().requires_grad_(true), wproj = wproj0.clone().requires_grad_(true),
         bproj = bproj0.clone().requires_grad_(true);
    {
      compat::AutocastGuard autocast(kGpu, bf16 ? torch::kBFloat16 : torch::kFloat32);
      y[i] = i == 0 ? torch::linear(torch::gelu(torch::linear(x, wfc, bfc), "tanh"), wproj, bproj)
                    : kernels::mlp(x, wfc, bfc, wproj, bproj);
    }
    (y[i].to(torch::kFloat32) * up).sum().backward();
    grads[i] = {x.grad(), wfc.grad(), bfc.grad(), wproj.grad(), bproj.grad()};
  }
  EXPECT_EQ(y[1].scalar_type(), y[0].scalar_type());
  EXPECT_EQ(y[1].sizes(), y[0].sizes());
  EXPECT_LT(rel_diff(y[1], y[0]), tol);
  const char* names[] = {"x", "c_fc.weight", "c_fc.bias", "c_proj.weight", "c_proj.bias"};
  for (size_t k = 0; k < 5; ++k) {
    EXPECT_EQ(grads[1][k].scalar_type(), torch::kFloat32) << names[k];
    EXPECT_LT(rel_diff(grads[1][k], grads[0][k]), tol) << names[k];
  }
}

TEST(FusedMlp, Float32EqualsTorchOps) {
  GPT2P_REQUIRE_GPU();
  check_mlp(false, 1e-4);
}

TEST(FusedMlp, BFloat16EqualsTorchOpsWithinBf16Rounding) {
  GPT2P_REQUIRE_GPU();
  // Both round the pre-activation and the activation to bf16; the plain path also rounds its
  // weight and bias gradients to bf16, the fused one keeps them in float32.
  check_mlp(true, 2e-2);
}

// kernels::mlp with accumulate_grad over two micro-batches, both weights' .grad allocated before:
// added into in place, equal to what autograd accumulates without it.
TEST(FusedMlp, AccumulatesBothWeightGradientsInPlace) {
  GPT2P_REQUIRE_GPU();
  torch::manual_seed(15);
  const auto opts = torch::TensorOptions().device(kGpu);
  const auto wfc0 = torch::randn({256, 64}, opts) * 0.1, bfc0 = torch::randn({256}, opts) * 0.1,
             wproj0 = torch::randn({64, 256}, opts) * 0.1, bproj0 = torch::randn({64}, opts) * 0.1;
  const torch::Tensor xs[2] = {torch::randn({4, 50, 64}, opts), torch::randn({4, 50, 64}, opts)};
  const torch::Tensor ups[2] = {torch::randn({4, 50, 64}, opts), torch::randn({4, 50, 64}, opts)};
  std::vector<torch::Tensor> grads[2];
  for (int i = 0; i < 2; ++i) {
    const bool accumulate = i == 1;
    auto wfc = wfc0.clone().requires_grad_(true), bfc = bfc0.clone().requires_grad_(true),
         wproj = wproj0.clone().requires_grad_(true), bproj = bproj0.clone().requires_grad_(true);
    if (accumulate) {
      wfc.mutable_grad() = torch::zeros_like(wfc);
      wproj.mutable_grad() = torch::zeros_like(wproj);
    }
    const auto fc_before = accumulate ? wfc.grad().data_ptr() : nullptr;
    const auto proj_before = accumulate ? wproj.grad().data_ptr() : nullptr;
    for (int mb = 0; mb < 2; ++mb) {
      torch::Tensor y;
      {
        compat::AutocastGuard autocast(kGpu, torch::kBFloat16);
        y = kernels::mlp(xs[mb], wfc, bfc, wproj, bproj, accumulate);
      }
      (y.to(torch::kFloat32) * ups[mb]).sum().backward();
    }
    if (accumulate) {
      EXPECT_EQ(wfc.grad().data_ptr(), fc_before);
      EXPECT_EQ(wproj.grad().data_ptr(), proj_before);
    }
    grads[i] = {wfc.grad(), bfc.grad(), wproj.grad(), bproj.grad()};
  }
  const char* names[] = {"c_fc.weight", "c_fc.bias", "c_proj.weight", "c_proj.bias"};
  for (size_t k = 0; k < 4; ++k) EXPECT_LT(rel_diff(grads[1][k], grads[0][k]), 1e-5) << names[k];
}

// Two blocks of a model (a middle pipeline stage) with --kernels fused under bf16 autocast, their
// MLPs through kernels::mlp against the fused linears with torch::gelu between: the output and
// every gradient.
TEST(FusedMlp, ModelBlocksAgreeWithThePlainMlp) {
  GPT2P_REQUIRE_GPU();
  const auto config = testing::small_model(3, 1000, 64, 2, 32);
  torch::manual_seed(14);
  const auto opts = torch::TensorOptions().device(kGpu);
  const auto input = torch::randn({4, 32, 64}, opts), up = torch::randn({4, 32, 64}, opts);
  compat::set_strict_fp32(true);
  torch::Tensor out[2], gin[2];
  const bool was = kernels::gelu_epilogue_enabled();
  model::GPT2 models[2] = {model::GPT2(config, model::LayerRange{1, 3}),
                           model::GPT2(config, model::LayerRange{1, 3})};
  for (int i = 0; i < 2; ++i) {
    models[i]->reset_parameters(7);
    models[i]->to(kGpu);
    models[i]->set_kernels(model::Kernels::kFused);
    kernels::set_gelu_epilogue(i == 1);
    auto x = input.clone().requires_grad_(true);
    {
      compat::AutocastGuard autocast(kGpu, torch::kBFloat16);
      out[i] = models[i]->forward(x);
    }
    (out[i].to(torch::kFloat32) * up).sum().backward();
    gin[i] = x.grad();
  }
  kernels::set_gelu_epilogue(was);
  EXPECT_LT(rel_diff(out[1], out[0]), 2e-2);
  EXPECT_LT(rel_diff(gin[1], gin[0]), 2e-2);
  const auto plain = models[0]->named_parameters(), fused = models[1]->named_parameters();
  for (const auto& item : plain) {
    EXPECT_LT(rel_diff(fused[item.key()].grad(), item.value().grad()), 2e-2) << item.key();
  }
}

}  // namespace
}  // namespace gpt2p
