// AutocastCacheScope: forwards inside it reuse one bf16 copy of each weight (same results as
// casting every time), and after it a changed weight is cast anew (no stale copy).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <iterator>
#include <optional>
#include <set>
#include <vector>

#include "gpt2p/core/compat.h"

namespace gpt2p::compat {
namespace {

// Two micro-batches' forward + backward through one linear layer under bf16 autocast, each forward
// in its own guard (as GptStage does); returns the weight's accumulated gradient.
torch::Tensor two_microbatches(torch::nn::Linear& layer, const torch::Tensor& x, bool scope) {
  layer->zero_grad();
  std::optional<AutocastCacheScope> cache;
  if (scope) cache.emplace(true);
  for (int mb = 0; mb < 2; ++mb) {
    torch::Tensor y;
    {
      AutocastGuard autocast(torch::kCPU, true);
      y = layer(x.narrow(0, mb * 2, 2));
    }
    EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
    y.to(torch::kFloat32).pow(2).sum().backward();
  }
  return layer->weight.grad().clone();
}

TEST(AutocastCacheScope, SharedCastsGiveTheSameGradients) {
  torch::manual_seed(3);
  torch::nn::Linear layer(8, 4);
  const auto x = torch::randn({4, 8});
  const auto plain = two_microbatches(layer, x, false);
  const auto cached = two_microbatches(layer, x, true);
  EXPECT_TRUE(torch::equal(plain, cached));
}

// The autograd nodes (other than the weights' own AccumulateGrad) behind an output.
std::set<torch::autograd::Node*> graph_nodes(const torch::Tensor& y) {
  std::set<torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> todo{y.grad_fn().get()};
  while (!todo.empty()) {
    auto* n = todo.back();
    todo.pop_back();
    if (n == nullptr || !seen.insert(n).second) continue;
    for (const auto& e : n->next_edges()) todo.push_back(e.function.get());
  }
  for (auto it = seen.begin(); it != seen.end();) {
    it = (*it)->name().find("AccumulateGrad") != std::string::npos ? seen.erase(it) : std::next(it);
  }
  return seen;
}

// With the scope both micro-batches' graphs go through the same cast of the weight; without it
// each forward casts again (no node in common).
TEST(AutocastCacheScope, MicroBatchesShareOneCastOfEachWeight) {
  torch::nn::Linear layer(8, 4);
  const auto x = torch::randn({2, 8});
  for (bool scope : {false, true}) {
    std::optional<AutocastCacheScope> cache;
    if (scope) cache.emplace(true);
    torch::Tensor a, b;
    {
      AutocastGuard autocast(torch::kCPU, true);
      a = layer(x);
    }
    {
      AutocastGuard autocast(torch::kCPU, true);
      b = layer(x);
    }
    const auto na = graph_nodes(a), nb = graph_nodes(b);
    std::vector<torch::autograd::Node*> shared;
    std::set_intersection(na.begin(), na.end(), nb.begin(), nb.end(), std::back_inserter(shared));
    EXPECT_EQ(!shared.empty(), scope) << (scope ? "with" : "without") << " the scope";
  }
}

TEST(AutocastCacheScope, AChangedWeightIsCastAnewAfterTheScope) {
  torch::manual_seed(4);
  torch::nn::Linear layer(8, 4);
  const auto x = torch::randn({2, 8});
  torch::Tensor before, after, expect;
  {
    AutocastCacheScope cache(true);
    AutocastGuard autocast(torch::kCPU, true);
    before = layer(x);
  }
  {
    torch::NoGradGuard no_grad;
    layer->weight.add_(1.0);  // the optimizer step
  }
  {
    AutocastCacheScope cache(true);
    AutocastGuard autocast(torch::kCPU, true);
    after = layer(x);
  }
  {
    torch::NoGradGuard no_grad;
    expect =
        torch::nn::functional::linear(x.to(torch::kBFloat16), layer->weight.to(torch::kBFloat16),
                                      layer->bias.to(torch::kBFloat16));
  }
  EXPECT_FALSE(torch::equal(before, after));
  EXPECT_TRUE(torch::allclose(after.to(torch::kFloat32), expect.to(torch::kFloat32), 1e-2, 1e-2));
}

}  // namespace
}  // namespace gpt2p::compat
