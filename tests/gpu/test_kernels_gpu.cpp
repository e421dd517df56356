// The project's CUDA kernels (src/kernels/) against the reference paths they replace: each kernel
// alone, the fused LM head, and whole models (a full GPT-2 as dp_train runs it, and a pipeline's
// last stage) with --kernels fused against --kernels reference. float32 must agree to float
// rounding; bfloat16 within the stated tolerances (both paths round the logits to bf16, but the
// fused one keeps the gradient GEMMs' sums in float32 where the reference rounds a chunk's
// weight gradient to bf16 before adding it).
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <cmath>

#include "gpt2p/compat/attention.h"
#include "gpt2p/compat/device.h"
#include "gpt2p/kernels/fused_head.h"
#include "gpt2p/kernels/fused_linear.h"
#include "gpt2p/model/gpt2.h"
#include "gpt2p/model/lm_head_loss.h"
#include "support/gpu_compare.h"
#include "support/small_model.h"

namespace gpt2p {
namespace {

namespace F = torch::nn::functional;

const torch::Device kGpu(torch::kCUDA, 0);

using gpt2p::testing::rel_diff;

// The kernel's contract computed with ATen in float64: per-row weighted losses and the weighted
// gradient (0 in padded columns).
struct Expected {
  torch::Tensor losses, grad;
};
Expected expected(const torch::Tensor& logits, const torch::Tensor& labels,
                  const torch::Tensor& weights, int64_t vocab) {
  const auto x = logits.to(torch::kFloat64).narrow(1, 0, vocab);
  const auto logp = torch::log_softmax(x, 1);
  const auto w = weights.to(torch::kFloat64);
  Expected e;
  e.losses = -logp.gather(1, labels.unsqueeze(1)).squeeze(1) * w;
  auto g = logp.exp() - F::one_hot(labels, vocab).to(torch::kFloat64);
  g = g * w.unsqueeze(1);
  e.grad = torch::zeros(logits.sizes(), g.options());
  e.grad.narrow(1, 0, vocab).copy_(g);
  return e;
}

void check_kernel(torch::ScalarType type, int64_t rows, int64_t vocab, int64_t padded,
                  double loss_tol, double grad_tol) {
  torch::manual_seed(1);
  const auto logits =
      (torch::randn({rows, padded}, torch::TensorOptions().device(kGpu)) * 3).to(type);
  const auto labels =
      torch::randint(0, vocab, {rows}, torch::TensorOptions().device(kGpu).dtype(torch::kLong));
  auto weights = torch::rand({rows}, torch::TensorOptions().device(kGpu));
  weights.index_put_(
      {torch::arange(0, rows, 5, torch::TensorOptions().device(kGpu).dtype(torch::kLong))}, 0.0);
  const auto want = expected(logits, labels, weights, vocab);
  auto work = logits.clone();
  const auto losses = kernels::softmax_cross_entropy_(work, labels, weights, vocab, /*grad=*/true);
  EXPECT_LT(rel_diff(losses, want.losses), loss_tol) << type << " " << rows << "x" << padded;
  EXPECT_LT(rel_diff(work, want.grad), grad_tol) << type << " " << rows << "x" << padded;
  // Rows of weight 0 (every fifth) have a zero gradient and loss.
  EXPECT_EQ(work[0].abs().max().item<double>(), 0.0);
  EXPECT_EQ(losses[0].item<double>(), 0.0);
  // Without grad the logits stay as they were.
  auto untouched = logits.clone();
  const auto again = kernels::softmax_cross_entropy_(untouched, labels, weights, vocab, false);
  EXPECT_TRUE(untouched.equal(logits));
  EXPECT_TRUE(again.equal(losses));
}

TEST(SoftmaxCrossEntropyKernel, Float32MatchesTheReferenceTightly) {
  GPT2P_REQUIRE_GPU();
  check_kernel(torch::kFloat32, 37, 1000, 1088, 1e-5, 1e-5);    // vectorised rows, padding
  check_kernel(torch::kFloat32, 9, 1001, 1001, 1e-5, 1e-5);     // unaligned rows: scalar path
  check_kernel(torch::kFloat32, 64, 50260, 50304, 1e-5, 1e-5);  // GPT-2's head
}

TEST(SoftmaxCrossEntropyKernel, BFloat16MatchesTheReferenceOfItsInputs) {
  GPT2P_REQUIRE_GPU();
  // The inputs are bf16, the arithmetic float32: only the gradient's bf16 rounding differs
  // (8 bits of mantissa: 2^-8 of the largest entry).
  check_kernel(torch::kBFloat16, 37, 1000, 1088, 1e-5, 4e-3);
  check_kernel(torch::kBFloat16, 9, 1001, 1003, 1e-5, 4e-3);
  check_kernel(torch::kBFloat16, 64, 50260, 50304, 1e-5, 4e-3);
}

TEST(SoftmaxCrossEntropyKernel, ALabelOutsideTheVocabularyGivesANaNLoss) {
  GPT2P_REQUIRE_GPU();
  auto logits = torch::randn({2, 64}, torch::TensorOptions().device(kGpu));
  const auto labels = torch::tensor({3, 60}, torch::TensorOptions().dtype(torch::kLong)).to(kGpu);
  const auto weights = torch::ones({2}, torch::TensorOptions().device(kGpu));
  const auto losses = kernels::softmax_cross_entropy_(logits, labels, weights, 50, true);
  EXPECT_TRUE(std::isfinite(losses[0].item<double>()));
  EXPECT_TRUE(std::isnan(losses[1].item<double>()));
}

TEST(AddMatmulTn, AccumulatesInFloat32) {
  GPT2P_REQUIRE_GPU();
  torch::manual_seed(2);
  for (auto type : {torch::kFloat32, torch::kBFloat16}) {
    const auto opts = torch::TensorOptions().device(kGpu);
    const auto a = torch::randn({300, 70}, opts).to(type),
               b = torch::randn({300, 40}, opts).to(type);
    auto out = torch::randn({70, 40}, opts);
    const auto want = out.to(torch::kFloat64) + a.to(torch::kFloat64).t().mm(b.to(torch::kFloat64));
    compat::set_strict_fp32(true);
    kernels::add_matmul_tn(out, a, b);
    EXPECT_LT(rel_diff(out, want), 1e-5) << type;
  }
}

// add = false writes out without reading it (the head's first chunk into an uninitialised
// buffer): NaN there must not survive; with no rows (k = 0) out becomes zeros.
TEST(AddMatmulTn, WithoutAddWritesOverWhatOutHeld) {
  GPT2P_REQUIRE_GPU();
  torch::manual_seed(4);
  const auto opts = torch::TensorOptions().device(kGpu);
  for (auto type : {torch::kFloat32, torch::kBFloat16}) {
    const auto a = torch::randn({300, 70}, opts).to(type),
               b = torch::randn({300, 40}, opts).to(type);
    auto out = torch::full({70, 40}, std::nan(""), opts);
    compat::set_strict_fp32(true);
    kernels::add_matmul_tn(out, a, b, /*add=*/false);
    const auto want = a.to(torch::kFloat64).t().mm(b.to(torch::kFloat64));
    EXPECT_TRUE(torch::isfinite(out).all().item<bool>()) << type;
    EXPECT_LT(rel_diff(out, want), 1e-5) << type;
    auto empty_out = torch::full({70, 40}, std::nan(""), opts);
    kernels::add_matmul_tn(empty_out, a.narrow(0, 0, 0), b.narrow(0, 0, 0), /*add=*/false);
    EXPECT_EQ(empty_out.abs().max().item<double>(), 0.0) << type;
  }
}

TEST(LinearWeightGrads, OneGemmGivesTheWeightAndBiasGradients) {
  GPT2P_REQUIRE_GPU();
  torch::manual_seed(5);
  compat::set_strict_fp32(true);
  for (auto type : {torch::kFloat32, torch::kBFloat16}) {
    const auto opts = torch::TensorOptions().device(kGpu);
    const auto dy = torch::randn({1000, 96}, opts).to(type),
               x = torch::randn({1000, 80}, opts).to(type);
    torch::Tensor dw, db;
    ASSERT_TRUE(kernels::linear_weight_grads(dy, x, dw, db)) << "cuBLASLt has no algorithm";
    const auto dy64 = dy.to(torch::kFloat64), x64 = x.to(torch::kFloat64);
    EXPECT_EQ(dw.scalar_type(), torch::kFloat32);
    EXPECT_LT(rel_diff(dw, dy64.t().mm(x64)), 1e-5) << type;
    EXPECT_LT(rel_diff(db, dy64.sum(0)), 1e-5) << type;
  }
}

// kernels::linear against torch::linear under autocast (bf16) and without (fp32): output and
// every gradient.
void check_linear(bool bf16, double tol) {
  torch::manual_seed(6);
  const auto opts = torch::TensorOptions().device(kGpu);
  const auto x0 = torch::randn({4, 50, 64}, opts), w0 = torch::randn({192, 64}, opts) * 0.1,
             b0 = torch::randn({192}, opts);
  const auto up = torch::randn({4, 50, 192}, opts);
  compat::set_strict_fp32(true);
  torch::Tensor y[2], gx[2], gw[2], gb[2];
  for (int i = 0; i < 2; ++i) {
    auto x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true),
         b = b0.clone().requires_grad_(true);
    {
      compat::AutocastGuard autocast(kGpu, bf16 ? torch::kBFloat16 : torch::kFloat32);
      y[i] = i == 0 ? torch::linear(x, w, b) : kernels::linear(x, w, b);
    }
    (y[i].to(torch::kFloat32) * up).sum().backward();
    gx[i] = x.grad();
    gw[i] = w.grad();
    gb[i] = b.grad();
  }
  EXPECT_EQ(y[1].scalar_type(), y[0].scalar_type());
  EXPECT_LT(rel_diff(y[1], y[0]), tol);
  EXPECT_LT(rel_diff(gx[1], gx[0]), tol);
  EXPECT_LT(rel_diff(gw[1], gw[0]), tol);
  EXPECT_LT(rel_diff(gb[1], gb[0]), tol);
  EXPECT_EQ(gw[1].scalar_type(), torch::kFloat32);
}

TEST(FusedLinear, Float32EqualsTorchLinear) {
  GPT2P_REQUIRE_GPU();
  check_linear(false, 1e-5);
}

TEST(FusedLinear, BFloat16EqualsTorchLinearWithinBf16Rounding) {
  GPT2P_REQUIRE_GPU();
  // Both compute in bf16 with float32 accumulation; the reference rounds its weight and bias
  // gradients to bf16 before casting them to float32.
  check_linear(true, 1e-2);
}

// Two micro-batches through kernels::linear with accumulate_grad, the weight's .grad allocated
// before (as a graphed pipeline stage keeps it): the weight gradient is added into that very
// tensor by the GEMM, and after both backwards equals what the plain path accumulates through
// autograd; without a .grad (the first backward of a run) the layer falls back to handing autograd
// its gradient.
TEST(FusedLinear, AccumulatesTheWeightGradientInPlace) {
  GPT2P_REQUIRE_GPU();
  torch::manual_seed(7);
  const auto opts = torch::TensorOptions().device(kGpu);
  const auto w0 = torch::randn({192, 64}, opts) * 0.1, b0 = torch::randn({192}, opts);
  const torch::Tensor xs[2] = {torch::randn({4, 50, 64}, opts), torch::randn({4, 50, 64}, opts)};
  const torch::Tensor ups[2] = {torch::randn({4, 50, 192}, opts), torch::randn({4, 50, 192}, opts)};
  torch::Tensor gw[2], gb[2];
  for (int i = 0; i < 2; ++i) {
    const bool accumulate = i == 1;
    auto w = w0.clone().requires_grad_(true), b = b0.clone().requires_grad_(true);
    if (accumulate) w.mutable_grad() = torch::zeros_like(w);
    const auto before = accumulate ? w.grad().data_ptr() : nullptr;
    for (int mb = 0; mb < 2; ++mb) {
      torch::Tensor y;
      {
        compat::AutocastGuard autocast(kGpu, torch::kBFloat16);
        y = kernels::linear(xs[mb], w, b, accumulate);
      }
      (y.to(torch::kFloat32) * ups[mb]).sum().backward();
    }
    if (accumulate) {
      EXPECT_EQ(w.grad().data_ptr(), before) << "the same .grad, added into";
    }
    gw[i] = w.grad();
    gb[i] = b.grad();
  }
  EXPECT_LT(rel_diff(gw[1], gw[0]), 1e-5);
  EXPECT_LT(rel_diff(gb[1], gb[0]), 1e-6);
  // No .grad yet: the gradient reaches autograd as usual.
  auto w = w0.clone().requires_grad_(true), b = b0.clone().requires_grad_(true);
  torch::Tensor y;
  {
    compat::AutocastGuard autocast(kGpu, torch::kBFloat16);
    y = kernels::linear(xs[0], w, b, /*accumulate_grad=*/true);
  }
  (y.to(torch::kFloat32) * ups[0]).sum().backward();
  ASSERT_TRUE(w.grad().defined());
  EXPECT_GT(w.grad().abs().sum().item<double>(), 0.0);
}

// The whole head: linear_cross_entropy fused against reference.
void check_head(torch::ScalarType compute, double loss_tol, double grad_tol) {
  torch::manual_seed(3);
  const auto opts = torch::TensorOptions().device(kGpu);
  const int64_t n = 300, c = 64, vocab = 1000, padded = 1024;
  const auto hidden0 = torch::randn({n, c}, opts), weight0 = torch::randn({padded, c}, opts) * 0.1;
  const auto labels = torch::randint(0, vocab, {n}, opts.dtype(torch::kLong));
  const auto weights = torch::rand({n}, opts) / n;
  compat::set_strict_fp32(true);
  torch::Tensor loss[2], gh[2], gw[2];
  int i = 0;
  for (auto k : {model::Kernels::kReference, model::Kernels::kFused}) {
    auto h = hidden0.clone().requires_grad_(true), w = weight0.clone().requires_grad_(true);
    loss[i] = model::linear_cross_entropy(h, w, labels, weights, vocab, compute, 128, k);
    (loss[i] * 1.5).backward();
    gh[i] = h.grad();
    gw[i] = w.grad();
    ++i;
  }
  EXPECT_LT(rel_diff(loss[1], loss[0]), loss_tol) << compute;
  EXPECT_LT(rel_diff(gh[1], gh[0]), grad_tol) << compute;
  EXPECT_LT(rel_diff(gw[1], gw[0]), grad_tol) << compute;
  EXPECT_EQ(gw[1].narrow(0, vocab, padded - vocab).abs().max().item<double>(), 0.0);
}

TEST(FusedHead, Float32EqualsTheReference) {
  GPT2P_REQUIRE_GPU();
  check_head(torch::kFloat32, 1e-6, 1e-5);
}

TEST(FusedHead, BFloat16EqualsTheReferenceWithinBf16Rounding) {
  GPT2P_REQUIRE_GPU();
  check_head(torch::kBFloat16, 1e-3, 2e-2);
}

// A model's loss and every parameter's gradient, fused against reference: the full model (as
// dp_train runs it) and the last stage of a pipeline (hidden states in, the head out).
void check_model(model::LayerRange range, bool bf16, double loss_tol, double grad_tol) {
  const auto config = testing::small_model(2, 1000, 64, 2, 32);
  torch::manual_seed(4);
  const auto opts = torch::TensorOptions().device(kGpu);
  const bool first = range.begin == 0;
  const auto input = first ? torch::randint(0, 1000, {4, 32}, opts.dtype(torch::kLong))
                           : torch::randn({4, 32, 64}, opts);
  const auto labels = torch::randint(0, 1000, {4, 32}, torch::kLong).to(kGpu);
  const auto mask = (torch::rand({4, 32}) < 0.5).to(torch::kFloat32);
  const int64_t targets = mask.sum().item<int64_t>();
  compat::set_strict_fp32(true);
  for (auto positions : {model::LossPositions::kTargets, model::LossPositions::kAll}) {
    const auto rows =
        model::loss_rows(labels, mask, 1, 1.0 / static_cast<double>(targets), positions);
    model::GPT2 ref(config, range), fused(config, range);
    ref->reset_parameters(7);
    fused->reset_parameters(7);
    ref->to(kGpu);
    fused->to(kGpu);
    fused->set_kernels(model::Kernels::kFused);
    torch::Tensor loss[2];
    int i = 0;
    for (auto* m : {&ref, &fused}) {
      {
        compat::AutocastGuard autocast(kGpu, bf16 ? torch::kBFloat16 : torch::kFloat32);
        loss[i] = (*m)->loss(input, rows[0], bf16 ? torch::kBFloat16 : torch::kFloat32);
      }
      loss[i].backward();
      ++i;
    }
    EXPECT_LT(rel_diff(loss[1], loss[0]), loss_tol) << name_of(positions);
    const auto pr = ref->named_parameters(), pf = fused->named_parameters();
    for (const auto& item : pr) {
      EXPECT_LT(rel_diff(pf[item.key()].grad(), item.value().grad()), grad_tol)
          << item.key() << " " << name_of(positions) << (bf16 ? " bf16" : " fp32");
    }
  }
}

TEST(FusedHeadModel, FullModelFloat32) {
  GPT2P_REQUIRE_GPU();
  check_model({0, 4}, false, 1e-6, 1e-4);
}

TEST(FusedHeadModel, FullModelBFloat16) {
  GPT2P_REQUIRE_GPU();
  check_model({0, 4}, true, 2e-3, 5e-2);
}

TEST(FusedHeadModel, LastPipelineStageFloat32) {
  GPT2P_REQUIRE_GPU();
  check_model({2, 4}, false, 1e-6, 1e-4);
}

TEST(FusedHeadModel, LastPipelineStageBFloat16) {
  GPT2P_REQUIRE_GPU();
  check_model({2, 4}, true, 2e-3, 5e-2);
}

// A middle pipeline stage (hidden states in and out, no embedding, no head): its output and
// gradients, fused against reference.
void check_middle_stage(bool bf16, double tol) {
  const auto config = testing::small_model(3, 1000, 64, 2, 32);
  torch::manual_seed(9);
  const auto opts = torch::TensorOptions().device(kGpu);
  const auto input = torch::randn({4, 32, 64}, opts);
  const auto up = torch::randn({4, 32, 64}, opts);
  compat::set_strict_fp32(true);
  model::GPT2 ref(config, model::LayerRange{1, 3}), fused(config, model::LayerRange{1, 3});
  ref->reset_parameters(7);
  fused->reset_parameters(7);
  ref->to(kGpu);
  fused->to(kGpu);
  fused->set_kernels(model::Kernels::kFused);
  torch::Tensor out[2], gin[2];
  int i = 0;
  for (auto* m : {&ref, &fused}) {
    auto x = input.clone().requires_grad_(true);
    {
      compat::AutocastGuard autocast(kGpu, bf16 ? torch::kBFloat16 : torch::kFloat32);
      out[i] = (*m)->forward(x);
    }
    (out[i].to(torch::kFloat32) * up).sum().backward();
    gin[i] = x.grad();
    ++i;
  }
  EXPECT_EQ(out[1].scalar_type(), out[0].scalar_type());
  EXPECT_LT(rel_diff(out[1], out[0]), tol);
  EXPECT_LT(rel_diff(gin[1], gin[0]), tol);
  const auto pr = ref->named_parameters(), pf = fused->named_parameters();
  for (const auto& item : pr) {
    EXPECT_LT(rel_diff(pf[item.key()].grad(), item.value().grad()), 10 * tol) << item.key();
  }
}

TEST(FusedHeadModel, MiddlePipelineStageFloat32) {
  GPT2P_REQUIRE_GPU();
  check_middle_stage(false, 1e-5);
}

TEST(FusedHeadModel, MiddlePipelineStageBFloat16) {
  GPT2P_REQUIRE_GPU();
  check_middle_stage(true, 2e-2);
}

TEST(AttentionBackend, NamesTheKernelThatRuns) {
  GPT2P_REQUIRE_GPU();
  compat::set_attention_backend(compat::Attention::kMath);
  EXPECT_EQ(compat::attention_backend(kGpu, torch::kBFloat16, 12, 1024, 64, 0.0), "math");
  compat::set_attention_backend(compat::Attention::kAuto);
  const auto chosen = compat::attention_backend(kGpu, torch::kBFloat16, 12, 1024, 64, 0.0);
  EXPECT_TRUE(chosen == "flash" || chosen == "cudnn" || chosen == "efficient") << chosen;
}

}  // namespace
}  // namespace gpt2p
