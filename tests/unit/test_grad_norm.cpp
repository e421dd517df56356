// Clipping with the multi-tensor kernels gives what libtorch's clip_grad_norm_ gives.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "gpt2p/compat/rng.h"
#include "gpt2p/parallel/data_parallel/grad_norm.h"

namespace gpt2p::parallel {
namespace {

// Parameters of a few shapes with random gradients (one without a gradient), twice the same.
std::vector<torch::Tensor> params_with_grads(double scale) {
  auto gen = compat::make_cpu_generator(7);
  std::vector<torch::Tensor> ps;
  for (auto shape : std::vector<std::vector<int64_t>>{{3, 5}, {7}, {2, 2, 4}, {1}, {4}}) {
    auto p = torch::zeros(shape, torch::TensorOptions().requires_grad(true));
    if (shape.size() != 1 || shape[0] != 4) {
      p.mutable_grad() = torch::randn(shape, gen, torch::kFloat32) * scale;
    }
    ps.push_back(p);
  }
  return ps;
}

std::vector<torch::Tensor> grads_of(const std::vector<torch::Tensor>& ps) {
  std::vector<torch::Tensor> g;
  for (const auto& p : ps) g.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
  return g;
}

TEST(GradNorm, MatchesLibtorchClipGradNormWhenClippingAndWhenNot) {
  for (double max_norm : {0.5, 1e6}) {
    SCOPED_TRACE("max_norm " + std::to_string(max_norm));
    auto ours = params_with_grads(3.0);
    auto ref = params_with_grads(3.0);
    const double n_ours = clip_grad_norm(ours, max_norm);
    const double n_ref = torch::nn::utils::clip_grad_norm_(ref, max_norm);
    EXPECT_NEAR(n_ours, n_ref, 1e-5 * n_ref);
    const auto a = grads_of(ours), b = grads_of(ref);
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a[i].defined(), b[i].defined()) << i;
      if (a[i].defined()) {
        EXPECT_TRUE(torch::allclose(a[i], b[i], 1e-6, 1e-7)) << i;
      }
    }
  }
}

TEST(GradNorm, QueuedClippingEqualsTheHostOneBitwise) {
  for (double max_norm : {0.5, 1e6}) {
    SCOPED_TRACE("max_norm " + std::to_string(max_norm));
    auto host = params_with_grads(3.0);
    auto queued = params_with_grads(3.0);
    const double n_host = clip_grad_norm(host, max_norm);
    const auto n_queued = clip_grad_norm_queued(queued, max_norm);
    EXPECT_EQ(n_queued.scalar_type(), torch::kFloat64);
    EXPECT_EQ(n_queued.item<double>(), n_host);
    const auto a = grads_of(host), b = grads_of(queued);
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a[i].defined(), b[i].defined()) << i;
      if (a[i].defined()) {
        EXPECT_TRUE(torch::equal(a[i], b[i])) << i;
      }
    }
  }
  EXPECT_EQ(clip_grad_norm_queued({}, 1.0).item<double>(), 0.0);
}

TEST(GradNorm, SumOfSquaresIsFloat64AndZeroForNoGradients) {
  const auto empty = grad_sq_norm({});
  EXPECT_EQ(empty.scalar_type(), torch::kFloat64);
  EXPECT_EQ(empty.item<double>(), 0.0);
  const auto sq = grad_sq_norm({torch::full({2, 2}, 3.0f), torch::full({5}, -2.0f)});
  EXPECT_EQ(sq.scalar_type(), torch::kFloat64);
  // Per-tensor norms are float32 (as in torch), so the squares carry float32 rounding.
  EXPECT_NEAR(sq.item<double>(), 4 * 9.0 + 5 * 4.0, 1e-6 * 56);
}

TEST(GradNorm, ScalesOnlyAboveTheLimit) {
  auto g = std::vector<torch::Tensor>{torch::full({3}, 4.0f)};
  EXPECT_EQ(scale_to_max_norm(g, 1.0, 2.0), 1.0);
  EXPECT_TRUE(torch::equal(g[0], torch::full({3}, 4.0f)));
  const double coef = scale_to_max_norm(g, 8.0, 2.0);
  EXPECT_NEAR(coef, 2.0 / (8.0 + 1e-6), 1e-12);
  EXPECT_TRUE(torch::allclose(g[0], torch::full({3}, static_cast<float>(4.0 * coef))));
}

TEST(GradNorm, UnscalingAPowerOfTwoScaleGivesTheUnscaledBits) {
  // Loss scaling (loss_scaler.h): gradients 1024 times too large, divided out while clipping.
  for (double max_norm : {0.5, 1e6, 0.0}) {
    SCOPED_TRACE("max_norm " + std::to_string(max_norm));
    auto plain = params_with_grads(3.0), queued = params_with_grads(3.0 * 1024),
         host = params_with_grads(3.0 * 1024);
    const auto n_plain = clip_grad_norm_queued(plain, max_norm);
    const auto n_queued = clip_grad_norm_queued(queued, max_norm, 1.0 / 1024);
    EXPECT_EQ(n_queued.item<double>(), n_plain.item<double>());
    std::vector<torch::Tensor> host_grads;
    for (const auto& p : host) {
      if (p.grad().defined()) host_grads.push_back(p.grad());
    }
    const double n_host = std::sqrt(grad_sq_norm(host_grads).item<double>()) / 1024;
    EXPECT_EQ(n_host, n_plain.item<double>());
    scale_to_max_norm(host_grads, n_host, max_norm, 1.0 / 1024);
    const auto a = grads_of(plain), b = grads_of(queued), c = grads_of(host);
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a[i].defined(), b[i].defined()) << i;
      if (!a[i].defined()) continue;
      EXPECT_TRUE(torch::equal(a[i], b[i])) << i;
      EXPECT_TRUE(torch::equal(a[i], c[i])) << i;
    }
  }
}

}  // namespace
}  // namespace gpt2p::parallel
