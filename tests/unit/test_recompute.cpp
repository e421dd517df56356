// Activation recompute (model/recompute.h): checkpointed() on small functions, and GPT-2 with
// Recompute::kBlocks against kNone: full models with and without dropout, a pipeline stage, hooks
// on the parameters, deferred weight gradients, eval and no-grad forwards.
//
// On the CPU in float32 the recompute runs the same kernels on the same values, and autograd sums
// the same terms in the same order (no gradient here sums more than two terms, and a + b == b + a
// exactly in IEEE arithmetic), so losses and gradients must be bitwise equal: the tests compare
// with torch::equal, no tolerance.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "gpt2p/compat/device.h"
#include "gpt2p/compat/rng.h"
#include "gpt2p/model/deferred_linear.h"
#include "gpt2p/model/gpt2.h"
#include "gpt2p/model/lm_head_loss.h"
#include "gpt2p/model/recompute.h"
#include "support/small_model.h"

namespace gpt2p::model {
namespace {

using TensorList = std::vector<torch::Tensor>;

// The checkpoint nodes in the autograd graph behind `t`.
int checkpoints_behind(const torch::Tensor& t) {
  std::set<torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> stack{t.grad_fn().get()};
  int n = 0;
  while (!stack.empty()) {
    auto* fn = stack.back();
    stack.pop_back();
    if (fn == nullptr || !seen.insert(fn).second) continue;
    if (fn->name() == kCheckpointNode) ++n;
    for (const auto& edge : fn->next_edges()) stack.push_back(edge.function.get());
  }
  return n;
}

// Every parameter of `got` has the gradient of the same-named one of `want`, bit for bit.
void expect_same_grads(const torch::nn::Module& want, const torch::nn::Module& got) {
  const auto theirs = got.named_parameters();
  for (const auto& item : want.named_parameters()) {
    const auto& g = theirs[item.key()].grad();
    ASSERT_EQ(g.defined(), item.value().grad().defined()) << item.key();
    if (g.defined()) {
      EXPECT_TRUE(g.equal(item.value().grad())) << item.key();
    }
  }
}

GPT2Config config(int64_t blocks, double dropout) {
  auto c = testing::small_model(blocks, 100, 64, 2, 16);  // vocab pads to 128
  c.dropout = dropout;
  return c;
}

// A training step's loss of a full model, backward done: the head at the target positions, as
// the trainers compute it (under bf16 autocast if `bf16`, backward outside it). `seed` seeds
// torch's generator just before the forward.
torch::Tensor train_loss(GPT2& model, uint64_t seed, bool bf16 = false) {
  torch::manual_seed(7);
  const auto ids = torch::randint(0, 100, {3, 16}, torch::kLong);
  const auto labels = torch::randint(0, 100, {3, 16}, torch::kLong);
  const auto mask = (torch::rand({3, 16}) < 0.6).to(torch::kFloat32);
  const auto rows =
      loss_rows(labels, mask, 1, 1.0 / mask.sum().item<double>(), LossPositions::kTargets);
  torch::manual_seed(seed);
  torch::Tensor loss;
  {
    compat::AutocastGuard autocast(torch::kCPU, bf16 ? torch::kBFloat16 : torch::kFloat32);
    loss = model->loss(ids, rows[0], bf16 ? torch::kBFloat16 : torch::kFloat32);
  }
  EXPECT_EQ(checkpoints_behind(loss), model->recompute() == Recompute::kBlocks
                                          ? static_cast<int>(model->config().n_layer)
                                          : 0);
  loss.backward();
  return loss.detach();
}

// ---- checkpointed() ----------------------------------------------------------------------------

TEST(RecomputeFn, UnusedOutputUndefinedInputAndParameters) {
  torch::manual_seed(1);
  const auto w0 = torch::randn({4}), a0 = torch::randn({3, 4});
  // Two outputs, one of which the loss ignores; the second input is undefined.
  const auto fn = [](const torch::Tensor& w) {
    return CheckpointFn([w](const TensorList& in) {
      EXPECT_FALSE(in[1].defined());
      return TensorList{torch::tanh(in[0] * w), in[0] * 3};
    });
  };
  torch::Tensor grad_a[2], grad_w[2], out[2];
  for (int i = 0; i < 2; ++i) {
    auto w = w0.clone().requires_grad_(true), a = a0.clone().requires_grad_(true);
    const auto outs =
        i == 0 ? fn(w)({a, torch::Tensor()}) : checkpointed(fn(w), {a, torch::Tensor()}, {w});
    EXPECT_EQ(checkpoints_behind(outs[0]), i);
    out[i] = outs[0].detach();
    (outs[0] * torch::arange(4)).sum().backward();
    grad_a[i] = a.grad();
    grad_w[i] = w.grad();
  }
  EXPECT_TRUE(out[1].equal(out[0]));
  EXPECT_TRUE(grad_a[1].equal(grad_a[0]));
  EXPECT_TRUE(grad_w[1].equal(grad_w[0]));
}

TEST(RecomputeFn, ParametersGetGradientsWhenNoInputRequiresGrad) {
  const auto w = torch::full({2}, 3.0).requires_grad_(true);
  const CheckpointFn fn = [&w](const TensorList& in) { return TensorList{in[0] * w}; };
  const auto x = torch::tensor({1.0f, 2.0f});
  // Without the parameters listed there is nothing for a checkpoint to record: fn runs plainly
  // (and autograd records it as it records anything).
  EXPECT_EQ(checkpoints_behind(checkpointed(fn, {x})[0]), 0);
  const auto out = checkpointed(fn, {x}, {w});
  ASSERT_TRUE(out[0].requires_grad());
  out[0].sum().backward();
  EXPECT_TRUE(w.grad().equal(x));
}

TEST(RecomputeFn, IdentityIntegersAndNoGrad) {
  const auto x = torch::tensor({1.0f, -2.0f}).requires_grad_(true);
  const CheckpointFn fn = [](const TensorList& in) { return TensorList{in[0], in[0].gt(0)}; };
  const auto out = checkpointed(fn, {x});
  EXPECT_FALSE(out[0].is_same(x));  // its own tensor, whose grad_fn is the checkpoint
  EXPECT_FALSE(out[1].requires_grad());
  (out[0] * 5).sum().backward();
  EXPECT_TRUE(x.grad().equal(torch::full({2}, 5.0)));
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(checkpointed(fn, {x})[0].is_same(x));  // fn(inputs) itself
}

TEST(RecomputeFn, SecondBackwardAndModifiedInputFail) {
  const CheckpointFn fn = [](const TensorList& in) { return TensorList{in[0] * in[0]}; };
  const auto x = torch::ones({3}).requires_grad_(true);
  auto y = checkpointed(fn, {x})[0].sum();
  y.backward({}, /*retain_graph=*/true);  // the saved input stays
  y.backward();
  EXPECT_TRUE(x.grad().equal(torch::full({3}, 4.0)));
  EXPECT_THROW(y.backward(), std::exception);  // freed by the previous backward

  auto h = x * 1;  // not a leaf: may be modified in place
  auto z = checkpointed(fn, {h})[0].sum();
  {
    torch::NoGradGuard no_grad;
    h.add_(1);
  }
  EXPECT_THROW(z.backward(), std::exception);  // the recompute would see other values
}

// ---- GPT-2 -------------------------------------------------------------------------------------

TEST(RecomputeBlocks, FullModelWithoutDropoutEqualsPlain) {
  const auto c = config(3, 0.0);
  GPT2 plain(c), recomputed(c);
  EXPECT_EQ(recomputed->recompute(), Recompute::kNone);
  recomputed->set_recompute(Recompute::kBlocks);
  EXPECT_EQ(recomputed->recompute(), Recompute::kBlocks);
  const auto want = train_loss(plain, 1);
  EXPECT_TRUE(train_loss(recomputed, 1).equal(want));
  expect_same_grads(*plain, *recomputed);
}

TEST(RecomputeBlocks, DropoutDrawsTheSameMasksAndLeavesTheGeneratorAsPlain) {
  const auto c = config(3, 0.1);
  GPT2 plain(c), recomputed(c), other_seed(c);
  recomputed->set_recompute(Recompute::kBlocks);
  const auto want = train_loss(plain, 5);
  const auto state_after = compat::cpu_rng_state();
  EXPECT_TRUE(train_loss(recomputed, 5).equal(want));
  EXPECT_TRUE(compat::cpu_rng_state() == state_after);
  expect_same_grads(*plain, *recomputed);
  // The masks matter: another seed gives another loss.
  other_seed->set_recompute(Recompute::kBlocks);
  EXPECT_FALSE(train_loss(other_seed, 6).equal(want));
}

TEST(RecomputeBlocks, RecomputeRunsUnderTheForwardsAutocast) {
  // bf16 autocast on the CPU: the recompute must cast as the forward did, or the gradients of
  // its float32 recompute would differ from those of the bf16 forward.
  const auto c = config(2, 0.1);
  GPT2 plain(c), recomputed(c);
  recomputed->set_recompute(Recompute::kBlocks);
  const auto want = train_loss(plain, 3, /*bf16=*/true);
  EXPECT_TRUE(train_loss(recomputed, 3, /*bf16=*/true).equal(want));
  expect_same_grads(*plain, *recomputed);
}

TEST(RecomputeBlocks, PipelineStageInputAndParameterGradients) {
  const auto c = config(4, 0.1);
  torch::manual_seed(3);
  const auto x0 = torch::randn({2, 16, 64}), up = torch::randn({2, 16, 64});
  for (const bool input_grad : {true, false}) {
    GPT2 plain(c, LayerRange{1, 3}), recomputed(c, LayerRange{1, 3});
    recomputed->set_recompute(Recompute::kBlocks);
    torch::Tensor grad_x[2], out[2];
    int i = 0;
    for (auto* m : {&plain, &recomputed}) {
      auto x = x0.clone().requires_grad_(input_grad);
      torch::manual_seed(11);
      const auto y = (*m)->forward(x);
      EXPECT_EQ(checkpoints_behind(y), i == 0 ? 0 : 2);
      (y * up).sum().backward();
      out[i] = y.detach();
      grad_x[i] = x.grad();
      ++i;
    }
    EXPECT_TRUE(out[1].equal(out[0]));
    ASSERT_EQ(grad_x[1].defined(), input_grad);
    if (input_grad) {
      EXPECT_TRUE(grad_x[1].equal(grad_x[0]));
    }
    expect_same_grads(*plain, *recomputed);
  }
}

TEST(RecomputeBlocks, ParameterHooksFireOncePerBackward) {
  for (const auto mode : {Recompute::kNone, Recompute::kBlocks}) {
    GPT2 model(config(3, 0.0));
    model->set_recompute(mode);
    std::map<std::string, int> calls;
    for (const auto& item : model->named_parameters()) {
      auto param = item.value();  // a handle of the parameter itself
      const std::string name = item.key();
      param.register_hook([&calls, name](const torch::Tensor&) { ++calls[name]; });
    }
    for (int step = 1; step <= 2; ++step) {
      train_loss(model, 1);
      for (const auto& item : model->named_parameters()) {
        EXPECT_EQ(calls[item.key()], step) << item.key() << " " << name_of(mode);
      }
    }
  }
}

TEST(RecomputeBlocks, DeferredWeightGradientsEqualPlain) {
  const auto c = config(3, 0.1);
  GPT2 plain(c), recomputed(c);
  recomputed->set_recompute(Recompute::kBlocks);
  for (auto* m : {&plain, &recomputed}) {
    auto store = std::make_shared<WeightGradStore>();
    (*m)->set_weight_grad_store(store);
    train_loss(*m, 2);
    // The blocks' linear weights are still waiting in the store.
    EXPECT_FALSE((*m)->named_parameters()["h.1.mlp.c_fc.weight"].grad().defined());
    EXPECT_TRUE((*m)->named_parameters()["h.1.mlp.c_fc.bias"].grad().defined());
    ASSERT_TRUE(store->has_unfiled());
    store->close(0);
    store->run(0);
    EXPECT_TRUE(store->pending().empty());
    EXPECT_TRUE((*m)->named_parameters()["h.1.mlp.c_fc.weight"].grad().defined());
  }
  expect_same_grads(*plain, *recomputed);
}

TEST(RecomputeBlocks, EvalAndNoGradForwardsRunPlainly) {
  const auto c = config(3, 0.1);
  GPT2 plain(c), recomputed(c);
  recomputed->set_recompute(Recompute::kBlocks);
  torch::manual_seed(4);
  const auto ids = torch::randint(0, 100, {2, 16}, torch::kLong);
  EXPECT_EQ(checkpoints_behind(recomputed->forward(ids)), 3);  // training, grad on
  plain->eval();
  recomputed->eval();
  const auto want = plain->forward(ids);
  const auto eval = recomputed->forward(ids);
  EXPECT_TRUE(eval.requires_grad());
  EXPECT_EQ(checkpoints_behind(eval), 0);
  EXPECT_TRUE(eval.equal(want));
  recomputed->train();
  plain->train();
  torch::NoGradGuard no_grad;
  torch::manual_seed(8);
  const auto want_train = plain->forward(ids);
  torch::manual_seed(8);
  const auto no_grad_out = recomputed->forward(ids);
  EXPECT_FALSE(no_grad_out.requires_grad());
  EXPECT_TRUE(no_grad_out.equal(want_train));
}

}  // namespace
}  // namespace gpt2p::model
