// The fused, chunked LM head + cross-entropy (model/lm_head_loss.h) against the plain computation:
// logits for every position, cross_entropy, autograd.
#include <gtest/gtest.h>

#include <cmath>

#include "gpt2p/model/gpt2.h"
#include "gpt2p/model/lm_head_loss.h"
#include "gpt2p/parallel/train/context.h"
#include "support/errors.h"
#include "support/small_model.h"

namespace gpt2p::model {
namespace {

using gpt2p::testing::error_of;
namespace F = torch::nn::functional;

// Largest |a - b| relative to the largest |b|.
double rel_diff(const torch::Tensor& a, const torch::Tensor& b) {
  const double scale = std::max(b.abs().max().item<double>(), 1e-30);
  return (a - b).abs().max().item<double>() / scale;
}

struct Head {
  torch::Tensor hidden, weight, labels, weights;
};

// n rows of width 16, a weight padded from 50 to 64 rows, random labels and weights.
Head random_head(int64_t n, uint64_t seed) {
  torch::manual_seed(seed);
  Head h;
  h.hidden = torch::randn({n, 16}).requires_grad_(true);
  h.weight = torch::randn({64, 16}).mul_(0.5).requires_grad_(true);
  h.labels = torch::randint(0, 50, {n}, torch::kLong);
  h.weights = torch::rand({n});
  return h;
}

torch::Tensor plain_loss(const Head& h, int64_t vocab) {
  const auto logits = h.hidden.mm(h.weight.t()).narrow(1, 0, vocab);
  const auto ce =
      F::cross_entropy(logits, h.labels, F::CrossEntropyFuncOptions().reduction(torch::kNone));
  return (ce * h.weights).sum();
}

TEST(LinearCrossEntropy, LossAndGradientsEqualThePlainHeadForEveryChunking) {
  for (int64_t chunk : {1, 3, 7, 23, 4096}) {
    Head a = random_head(23, 5), b = random_head(23, 5);
    const auto fused =
        linear_cross_entropy(a.hidden, a.weight, a.labels, a.weights, 50, torch::kFloat32, chunk);
    const auto plain = plain_loss(b, 50);
    EXPECT_LT(std::abs(fused.item<double>() - plain.item<double>()) / plain.item<double>(), 1e-6)
        << "chunk " << chunk;
    (fused * 1.7).backward();  // the incoming gradient scales what forward computed
    (plain * 1.7).backward();
    EXPECT_LT(rel_diff(a.hidden.grad(), b.hidden.grad()), 1e-5) << "chunk " << chunk;
    EXPECT_LT(rel_diff(a.weight.grad(), b.weight.grad()), 1e-5) << "chunk " << chunk;
    // Columns past the vocabulary never count: their weight rows get no gradient.
    EXPECT_EQ(a.weight.grad().narrow(0, 50, 14).abs().max().item<double>(), 0.0);
  }
}

// accumulate_grad: two micro-batches, the weight's .grad allocated before, each backward scaled
// by its incoming gradient. The weight's gradient is added into that very .grad and equals what
// autograd accumulates; without a .grad it reaches autograd as usual.
TEST(LinearCrossEntropy, AccumulatesTheWeightGradientIntoItsGrad) {
  torch::Tensor grads[2];
  for (int i = 0; i < 2; ++i) {
    const bool accumulate = i == 1;
    Head a = random_head(23, 5);
    if (accumulate) a.weight.mutable_grad() = torch::zeros_like(a.weight);
    const void* before = accumulate ? a.weight.grad().data_ptr() : nullptr;
    for (int mb = 0; mb < 2; ++mb) {
      Head b = random_head(23, 11 + mb);
      const auto loss = linear_cross_entropy(a.hidden, a.weight, b.labels, b.weights, 50,
                                             torch::kFloat32, 7, Kernels::kReference, accumulate);
      (loss * (1.5 + mb)).backward();
    }
    if (accumulate) {
      EXPECT_EQ(a.weight.grad().data_ptr(), before) << "the same .grad, added into";
    }
    grads[i] = a.weight.grad();
  }
  EXPECT_LT(rel_diff(grads[1], grads[0]), 1e-6);
  EXPECT_GT(grads[1].abs().max().item<double>(), 0.0);
  Head a = random_head(5, 3);
  linear_cross_entropy(a.hidden, a.weight, a.labels, a.weights, 50, torch::kFloat32, 7,
                       Kernels::kReference, /*accumulate_grad=*/true)
      .backward();
  ASSERT_TRUE(a.weight.grad().defined());
  EXPECT_GT(a.weight.grad().abs().max().item<double>(), 0.0);
}

TEST(LinearCrossEntropy, ZeroWeightRowsContributeNothingAndNoRowsGiveZero) {
  Head a = random_head(6, 9);
  a.weights.narrow(0, 2, 3).zero_();
  linear_cross_entropy(a.hidden, a.weight, a.labels, a.weights, 50, torch::kFloat32, 4).backward();
  EXPECT_EQ(a.hidden.grad().narrow(0, 2, 3).abs().max().item<double>(), 0.0);
  EXPECT_GT(a.hidden.grad()[0].abs().max().item<double>(), 0.0);

  Head none = random_head(0, 9);
  const auto loss = linear_cross_entropy(none.hidden, none.weight, none.labels, none.weights, 50,
                                         torch::kFloat32);
  EXPECT_EQ(loss.item<double>(), 0.0);
  loss.backward();
  EXPECT_EQ(none.weight.grad().abs().max().item<double>(), 0.0);
}

TEST(LinearCrossEntropy, WithoutGradModeOnlyTheLoss) {
  Head a = random_head(9, 2);
  const double with_grads =
      linear_cross_entropy(a.hidden, a.weight, a.labels, a.weights, 50, torch::kFloat32, 4)
          .item<double>();
  torch::NoGradGuard no_grad;
  const auto loss =
      linear_cross_entropy(a.hidden, a.weight, a.labels, a.weights, 50, torch::kFloat32, 4);
  EXPECT_FALSE(loss.requires_grad());
  EXPECT_NEAR(loss.item<double>(), with_grads, 1e-6 * std::abs(with_grads));
}

TEST(LinearCrossEntropy, Bf16IsCloseToFloat32) {
  Head a = random_head(31, 4), b = random_head(31, 4);
  const auto fused =
      linear_cross_entropy(a.hidden, a.weight, a.labels, a.weights, 50, torch::kBFloat16, 8);
  const auto plain = plain_loss(b, 50);
  EXPECT_EQ(fused.scalar_type(), torch::kFloat32);
  EXPECT_LT(std::abs(fused.item<double>() - plain.item<double>()) / plain.item<double>(), 2e-2);
  fused.backward();
  plain.backward();
  EXPECT_EQ(a.hidden.grad().scalar_type(), torch::kFloat32);
  EXPECT_EQ(a.weight.grad().scalar_type(), torch::kFloat32);
  EXPECT_LT(rel_diff(a.hidden.grad(), b.hidden.grad()), 3e-2);
  EXPECT_LT(rel_diff(a.weight.grad(), b.weight.grad()), 3e-2);
}

TEST(LinearCrossEntropy, BadShapesSayWhatToPass) {
  Head a = random_head(4, 1);
  EXPECT_NE(error_of([&] {
              linear_cross_entropy(a.hidden, a.weight.narrow(1, 0, 8), a.labels, a.weights, 50,
                                   torch::kFloat32);
            }).find("are not [n, C] and [V, C]"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              linear_cross_entropy(a.hidden, a.weight, a.labels.narrow(0, 0, 3), a.weights, 50,
                                   torch::kFloat32);
            }).find("one label and one weight per row"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              linear_cross_entropy(a.hidden, a.weight, a.labels, a.weights, 65, torch::kFloat32);
            }).find("vocab_size 65"),
            std::string::npos);
}

// ---- loss_rows ---------------------------------------------------------------------------------

TEST(LossRows, TargetsKeepTheMaskedPositionsOfEachMicroBatch) {
  const auto labels = torch::arange(12, torch::kLong).view({4, 3});
  const auto mask =
      torch::tensor({0, 1, 1, 0, 0, 0, 1, 0, 1, 0, 1, 0}, torch::kFloat32).view({4, 3});
  const auto parts = loss_rows(labels, mask, 2, 0.5, LossPositions::kTargets);
  ASSERT_EQ(parts.size(), 2u);
  // Micro-batch 0 = rows 0-1 (positions 0..5), micro-batch 1 = rows 2-3.
  EXPECT_TRUE(parts[0].index.equal(torch::tensor({1, 2}, torch::kLong)));
  EXPECT_TRUE(parts[0].labels.equal(torch::tensor({1, 2}, torch::kLong)));
  EXPECT_TRUE(parts[1].index.equal(torch::tensor({0, 2, 4}, torch::kLong)));
  EXPECT_TRUE(parts[1].labels.equal(torch::tensor({6, 8, 10}, torch::kLong)));
  EXPECT_TRUE(parts[1].weights.equal(torch::full({3}, 0.5)));
}

TEST(LossRows, AllKeepsEveryPositionWithZeroWeightsAndValidLabels) {
  auto labels = torch::arange(6, torch::kLong).view({2, 3});
  labels[1][2] = -100;  // e.g. an ignore index under mask 0
  const auto mask = torch::tensor({0, 1, 1, 1, 0, 0}, torch::kFloat32).view({2, 3});
  const auto parts = loss_rows(labels, mask, 1, 2.0, LossPositions::kAll);
  ASSERT_EQ(parts.size(), 1u);
  EXPECT_EQ(parts[0].index.size(0), 6);
  EXPECT_TRUE(parts[0].weights.equal(torch::tensor({0, 2, 2, 2, 0, 0}, torch::kFloat32)));
  EXPECT_EQ(parts[0].labels.min().item<int64_t>(), 0);
}

TEST(LossRows, RejectsPartsThatDoNotDivideAndUnknownNames) {
  const auto labels = torch::zeros({3, 2}, torch::kLong);
  EXPECT_NE(error_of([&] {
              loss_rows(labels, torch::ones({3, 2}), 2, 1.0, LossPositions::kAll);
            }).find("3 rows do not split into 2 parts"),
            std::string::npos);
  EXPECT_EQ(from_name<LossPositions>(name_of(LossPositions::kAll)), LossPositions::kAll);
  EXPECT_FALSE(from_name<LossPositions>("some").has_value());
}

// ---- GPT2::loss --------------------------------------------------------------------------------

// Vocabulary 100 pads to 128: padded logit columns exist.
GPT2Config small_config() { return gpt2p::testing::small_model(2, 100, 32, 2, 12); }

TEST(GPT2Loss, EqualsTheScaledLossOfTheLogitsWithTheSameGradients) {
  const auto config = small_config();
  torch::manual_seed(8);
  const auto ids = torch::randint(0, 100, {3, 10}, torch::kLong);
  const auto labels = torch::randint(0, 100, {3, 10}, torch::kLong);
  const auto mask = (torch::rand({3, 10}) < 0.4).to(torch::kFloat32);
  const int64_t targets = mask.sum().item<int64_t>();
  ASSERT_GT(targets, 0);
  for (auto positions : {LossPositions::kTargets, LossPositions::kAll}) {
    GPT2 fused(config), plain(config);
    fused->reset_parameters(3);
    plain->reset_parameters(3);
    const auto rows = loss_rows(labels, mask, 1, 2.0 / static_cast<double>(targets), positions);
    const auto a = fused->loss(ids, rows[0], torch::kFloat32, /*chunk_rows=*/7);
    const auto b = parallel::scaled_loss(plain->forward(ids), labels, mask, 100, targets, 2);
    EXPECT_NEAR(a.item<double>(), b.item<double>(), 1e-5 * b.item<double>()) << name_of(positions);
    a.backward();
    b.backward();
    const auto pa = fused->named_parameters(), pb = plain->named_parameters();
    for (const auto& item : pa) {
      EXPECT_LT(rel_diff(item.value().grad(), pb[item.key()].grad()), 1e-5)
          << item.key() << " " << name_of(positions);
    }
  }
}

TEST(GPT2Loss, OnlyTheStageWithTheHeadHasALoss) {
  GPT2 first(small_config(), LayerRange{0, 2});
  const auto ids = torch::zeros({1, 4}, torch::kLong);
  const auto rows = loss_rows(ids, torch::ones({1, 4}), 1, 1.0, LossPositions::kTargets);
  EXPECT_NE(
      error_of([&] { first->loss(ids, rows[0], torch::kFloat32); }).find("does not hold the head"),
      std::string::npos);
}

}  // namespace
}  // namespace gpt2p::model
