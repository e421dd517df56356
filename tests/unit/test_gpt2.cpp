// GPT-2 modules: shapes, causality, tied weights, init, stages, attention paths, losses.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "gpt2p/compat/attention.h"
#include "gpt2p/compat/device.h"
#include "gpt2p/core/error.h"
#include "gpt2p/model/config.h"
#include "gpt2p/model/gpt2.h"
#include "support/errors.h"

namespace gpt2p::model {
namespace {

using gpt2p::testing::error_of;

GPT2Config small_config() {
  GPT2Config c = preset("tiny");
  c.vocab_size = 100;  // pads to 128: padded columns exist
  c.n_layer = 3;
  c.n_ctx = 16;
  c.dropout = 0.0;
  return c;
}

torch::Tensor random_ids(const GPT2Config& c, int64_t b, int64_t t, int64_t seed) {
  torch::manual_seed(seed);
  return torch::randint(0, c.vocab_size, {b, t}, torch::kLong);
}

TEST(GPT2Config, PresetsAndPaddingAndValidation) {
  const auto g = preset("gpt2");
  EXPECT_EQ(g.n_layer, 12);
  EXPECT_EQ(g.n_embd, 768);
  EXPECT_EQ(g.vocab_size, 50260);
  EXPECT_EQ(g.padded_vocab_size(), 50304);
  EXPECT_EQ(preset("gpt2-xl").n_head, 25);
  // 124M model with our padded vocab: 124.44M for HF's 50257 rows + 47 extra rows * 768.
  EXPECT_EQ(g.num_parameters(), 124439808 + (50304 - 50257) * 768);
  const std::string msg = error_of([] { preset("gpt3"); });
  EXPECT_NE(msg.find("unknown GPT-2 model preset 'gpt3'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("tiny, gpt2, gpt2-medium, gpt2-large, gpt2-xl"), std::string::npos) << msg;
  GPT2Config bad = g;
  bad.n_embd = 770;
  EXPECT_NE(error_of([&] { bad.validate(); }).find("n_embd = 770"), std::string::npos);
}

TEST(GPT2Config, JsonRoundTripAndUnknownField) {
  GPT2Config c = small_config();
  EXPECT_EQ(config_from_json(to_json(c)), c);
  auto j = to_json(c);
  j["n_layers"] = 3;
  EXPECT_NE(error_of([&] { config_from_json(j); }).find("unknown GPT-2 config field 'n_layers'"),
            std::string::npos);
}

TEST(GPT2, ShapesAndParameterNames) {
  const auto c = small_config();
  GPT2 model(c);
  const auto logits = model->forward(random_ids(c, 2, 7, 1));
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{2, 7, c.padded_vocab_size()}));
  const auto params = model->named_parameters();
  for (const char* name : {"wte.weight", "wpe.weight", "h.0.ln_1.weight", "h.2.attn.c_attn.weight",
                           "h.1.attn.c_proj.bias", "h.0.ln_2.bias", "h.2.mlp.c_fc.weight",
                           "h.2.mlp.c_proj.weight", "ln_f.weight"}) {
    EXPECT_NE(params.find(name), nullptr) << name;
  }
  EXPECT_EQ(params["h.2.attn.c_attn.weight"].sizes(), (std::vector<int64_t>{3 * 64, 64}));
  int64_t total = 0;
  for (const auto& p : model->parameters()) total += p.numel();
  EXPECT_EQ(total, c.num_parameters());
  EXPECT_NE(error_of([&] { model->forward(random_ids(c, 1, 17, 1)); }).find("exceeds"),
            std::string::npos);
}

TEST(GPT2, CausalFutureTokensDoNotChangeEarlierLogits) {
  const auto c = small_config();
  GPT2 model(c);
  model->reset_parameters(3);
  model->eval();
  auto ids = random_ids(c, 1, 10, 2);
  const auto a = model->forward(ids);
  ids[0][7] = (ids[0][7].item<int64_t>() + 1) % c.vocab_size;
  const auto b = model->forward(ids);
  EXPECT_TRUE(torch::allclose(a.narrow(1, 0, 7), b.narrow(1, 0, 7), 0, 1e-6));
  EXPECT_FALSE(torch::allclose(a.narrow(1, 7, 3), b.narrow(1, 7, 3), 0, 1e-6));
}

TEST(GPT2, HeadIsTiedToEmbedding) {
  const auto c = small_config();
  GPT2 model(c);
  const auto ids = random_ids(c, 1, 4, 4);
  {
    torch::NoGradGuard g;
    model->wte->weight.normal_(0, 0.05);
  }
  const auto before = model->forward(ids).detach().clone();
  EXPECT_TRUE(model->tied_parameter().is_same(model->wte->weight));
  {
    torch::NoGradGuard g;
    model->wte->weight.mul_(2.0);  // changes both ends of the network
  }
  EXPECT_FALSE(torch::allclose(before, model->forward(ids)));
  // The head has no weight of its own.
  for (const auto& item : model->named_parameters())
    EXPECT_EQ(item.key().find("lm_head"), std::string::npos);
}

TEST(GPT2, EmbeddingGradSinkTakesTheLookupsPartOfTheTiedGradient) {
  const auto c = small_config();
  GPT2 model(c);
  model->reset_parameters(3);
  const auto ids = random_ids(c, 2, 6, 5);
  const auto tied_grad = [&] {
    model->zero_grad();
    model->wte->weight.mutable_grad() = torch::Tensor();
    model->lm_loss_all(model->forward(ids), ids).backward();
    return model->wte->weight.grad().clone();
  };
  const auto plain = tied_grad();
  torch::Tensor got_ids, got_grad;
  int calls = 0;
  model->set_embedding_grad_sink([&](const torch::Tensor& i, const torch::Tensor& g) {
    got_ids = i;
    got_grad = g.clone();
    ++calls;
  });
  const auto head_only = tied_grad();
  ASSERT_EQ(calls, 1);
  EXPECT_TRUE(torch::equal(got_ids, ids));
  EXPECT_EQ(got_grad.sizes(), torch::IntArrayRef({2, 6, c.n_embd}));
  EXPECT_FALSE(torch::allclose(head_only, plain, 1e-4, 1e-6)) << "the lookup's part is left out";
  const auto lookup = at::embedding_dense_backward(got_grad.view({-1, c.n_embd}), ids.view({-1}),
                                                   c.padded_vocab_size(), -1, false);
  EXPECT_TRUE(torch::allclose(head_only + lookup, plain, 1e-5, 1e-7));
  // Forward is unchanged, and an empty sink restores the plain lookup.
  model->set_embedding_grad_sink({});
  EXPECT_TRUE(torch::allclose(tied_grad(), plain, 1e-6, 1e-8));
  EXPECT_EQ(calls, 1);
  GPT2 tail(c, LayerRange{1, static_cast<int>(c.num_stage_layers())});
  EXPECT_NE(error_of([&] {
              tail->set_embedding_grad_sink([](const auto&, const auto&) {});
            }).find("stage without the embedding"),
            std::string::npos);
}

// Every parameter's gradient after backward of `micro` micro-batches of ids; with a store, each
// backward's deferred weight gradients are filed under its micro-batch and run afterwards.
std::vector<torch::Tensor> grads_of(GPT2& model, const std::vector<torch::Tensor>& micro,
                                    const std::shared_ptr<WeightGradStore>& store, bool bf16) {
  model->zero_grad();
  for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();
  model->set_weight_grad_store(store);
  for (size_t k = 0; k < micro.size(); ++k) {
    torch::Tensor loss;
    {
      compat::AutocastGuard autocast(torch::kCPU, bf16 ? torch::kBFloat16 : torch::kFloat32);
      loss = model->lm_loss_all(model->forward(micro[k]).to(torch::kFloat32), micro[k]);
    }
    loss.backward();
    if (store) store->close(static_cast<int>(k));
  }
  if (store) {
    for (size_t k = 0; k < micro.size(); ++k) store->run(static_cast<int>(k));
  }
  model->set_weight_grad_store(nullptr);
  std::vector<torch::Tensor> g;
  for (const auto& p : model->parameters()) g.push_back(p.grad().clone());
  return g;
}

TEST(GPT2, DeferredWeightGradientsAddUpToThePlainBackward) {
  const auto c = small_config();
  GPT2 model(c);
  model->reset_parameters(4);
  const std::vector<torch::Tensor> micro{random_ids(c, 2, 6, 7), random_ids(c, 2, 6, 8)};
  for (const bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16 autocast" : "fp32");
    const auto plain = grads_of(model, micro, nullptr, bf16);
    auto store = std::make_shared<WeightGradStore>();
    const auto split = grads_of(model, micro, store, bf16);
    ASSERT_EQ(plain.size(), split.size());
    for (size_t i = 0; i < plain.size(); ++i) {
      const double scale = plain[i].abs().max().item<double>() + 1e-12;
      const double diff = (split[i] - plain[i]).abs().max().item<double>() / scale;
      EXPECT_LE(diff, bf16 ? 2e-2 : 1e-5) << "parameter " << i;
    }
    EXPECT_TRUE(store->pending().empty());
    EXPECT_FALSE(store->has_unfiled());
  }
}

TEST(AutocastCacheScope, AWeightIsCastOncePerScopeAndTheGradientsStayTheSame) {
  const auto w = torch::randn({4, 4}).requires_grad_();
  const auto cast_twice = [&w] {
    std::vector<torch::Tensor> out;
    for (int k = 0; k < 2; ++k) {
      compat::AutocastGuard autocast(torch::kCPU, torch::kBFloat16);
      out.push_back(compat::cached_cast(w, torch::kBFloat16));
    }
    return out;
  };
  const auto apart = cast_twice();
  EXPECT_NE(apart[0].data_ptr(), apart[1].data_ptr());  // each guard's cache ended with it
  {
    compat::AutocastCacheScope casts;
    const auto shared = cast_twice();
    EXPECT_EQ(shared[0].data_ptr(), shared[1].data_ptr());
  }
  // Closed: a changed weight is cast anew.
  {
    torch::NoGradGuard no_grad;
    w.add_(1.0);
  }
  EXPECT_TRUE(torch::equal(cast_twice()[0], (w.detach() + 0).to(torch::kBFloat16)));

  // Micro-batches under one scope: the same gradients as with a cast per micro-batch.
  const auto c = small_config();
  GPT2 model(c);
  model->reset_parameters(6);
  const std::vector<torch::Tensor> micro{random_ids(c, 2, 6, 3), random_ids(c, 2, 6, 4)};
  const auto per_forward = grads_of(model, micro, nullptr, true);
  std::vector<torch::Tensor> once;
  {
    compat::AutocastCacheScope casts;
    once = grads_of(model, micro, nullptr, true);
  }
  ASSERT_EQ(once.size(), per_forward.size());
  for (size_t i = 0; i < once.size(); ++i) EXPECT_TRUE(torch::equal(once[i], per_forward[i])) << i;
}

TEST(GPT2, BackwardWithAStoreLeavesOnlyTheBlockLinearWeightsForLater) {
  const auto c = small_config();
  GPT2 model(c);
  const auto ids = random_ids(c, 2, 5, 9);
  auto store = std::make_shared<WeightGradStore>();
  model->set_weight_grad_store(store);
  model->lm_loss_all(model->forward(ids), ids).backward();
  int deferred = 0;
  for (const auto& item : model->named_parameters()) {
    const auto& name = item.key();
    const bool linear_weight =
        name.find(".weight") != std::string::npos &&
        (name.find("c_attn") != std::string::npos || name.find("c_proj") != std::string::npos ||
         name.find("c_fc") != std::string::npos);
    EXPECT_EQ(item.value().grad().defined(), !linear_weight) << name;
    deferred += linear_weight ? 1 : 0;
  }
  EXPECT_EQ(deferred, 4 * c.n_layer);
  EXPECT_TRUE(store->has_unfiled());
  store->close(3);
  EXPECT_EQ(store->pending(), std::vector<int>{3});
  EXPECT_NE(error_of([&] { store->run(4); }).find("no deferred weight gradients for micro-batch 4"),
            std::string::npos);
  store->run(3);
  for (const auto& p : model->parameters()) EXPECT_TRUE(p.grad().defined());
  store->close(3);  // nothing pushed since: an empty filing, run once
  EXPECT_NE(error_of([&] { store->close(3); }).find("filed twice"), std::string::npos);
}

TEST(GPT2, InitStatistics) {
  GPT2Config c = preset("tiny");
  c.n_layer = 8;
  GPT2 model(c);
  model->reset_parameters(7);
  const auto p = model->named_parameters();
  auto std_of = [&](const char* n) { return p[n].std().item<double>(); };
  EXPECT_NEAR(std_of("h.3.attn.c_attn.weight"), 0.02, 0.002);
  EXPECT_NEAR(std_of("h.3.mlp.c_fc.weight"), 0.02, 0.002);
  EXPECT_NEAR(std_of("h.3.mlp.c_proj.weight"), 0.02 / std::sqrt(16.0), 0.0005);
  EXPECT_NEAR(std_of("h.3.attn.c_proj.weight"), 0.02 / std::sqrt(16.0), 0.0008);
  EXPECT_NEAR(p["wte.weight"].narrow(0, 0, c.vocab_size).std().item<double>(), 0.02, 0.001);
  EXPECT_EQ(p["wte.weight"]
                .narrow(0, c.vocab_size, c.padded_vocab_size() - c.vocab_size)
                .abs()
                .sum()
                .item<double>(),
            0.0);
  EXPECT_EQ(p["h.3.attn.c_attn.bias"].abs().sum().item<double>(), 0.0);
  EXPECT_TRUE(torch::equal(p["h.5.ln_2.weight"], torch::ones({c.n_embd})));
  EXPECT_TRUE(torch::equal(p["ln_f.bias"], torch::zeros({c.n_embd})));
  // Layers differ from each other, and a different seed gives different weights.
  EXPECT_FALSE(torch::equal(p["h.0.mlp.c_fc.weight"], p["h.1.mlp.c_fc.weight"]));
  GPT2 other(c);
  other->reset_parameters(8);
  EXPECT_FALSE(
      torch::equal(p["h.0.mlp.c_fc.weight"], other->named_parameters()["h.0.mlp.c_fc.weight"]));
}

TEST(GPT2, StagesHoldTheFullModelsLayersAndChainToItsForward) {
  const auto c = small_config();  // 5 stage layers: emb, h.0, h.1, h.2, head
  GPT2 full(c);
  full->reset_parameters(42);
  full->eval();
  const std::vector<LayerRange> ranges = {{0, 2}, {2, 3}, {3, 5}};
  std::vector<GPT2> stages;
  for (const auto& r : ranges) {
    stages.emplace_back(c, r);
    stages.back()->reset_parameters(42);
    stages.back()->eval();
  }
  const auto full_params = full->named_parameters();
  size_t seen = 0;
  for (const auto& stage : stages) {
    for (const auto& item : stage->named_parameters()) {
      ASSERT_NE(full_params.find(item.key()), nullptr) << item.key();
      EXPECT_TRUE(torch::equal(item.value(), full_params[item.key()])) << item.key();
      ++seen;
    }
  }
  EXPECT_EQ(seen, full_params.size() + 1);  // + the head stage's own wte
  EXPECT_FALSE(stages[1]->wte);
  EXPECT_FALSE(stages[0]->ln_f);
  EXPECT_FALSE(stages[2]->wpe);
  EXPECT_TRUE(torch::equal(stages[2]->tied_parameter(), stages[0]->tied_parameter()));
  EXPECT_NE(stages[2]->named_parameters().find("h.2.mlp.c_fc.weight"), nullptr);
  EXPECT_EQ(stages[2]->named_parameters().find("h.1.mlp.c_fc.weight"), nullptr);

  const auto ids = random_ids(c, 2, 9, 5);
  auto x = ids;
  for (auto& stage : stages) x = stage->forward(x);
  EXPECT_TRUE(torch::allclose(x, full->forward(ids), 1e-5, 1e-6));
  EXPECT_EQ(stages[1]->forward(stages[0]->forward(ids)).sizes(),
            (std::vector<int64_t>{2, 9, c.n_embd}));
  EXPECT_NE(error_of([&] {
              GPT2(c, LayerRange{3, 6});
            }).find("layer range [3, 6)"),
            std::string::npos);
  EXPECT_NE(error_of([&] { stages[1]->forward(ids); }).find("expects hidden states"),
            std::string::npos);
}

TEST(Attention, FusedAndReferenceAgreeInFp32) {
  torch::manual_seed(0);
  const auto q = torch::randn({2, 3, 11, 8}), k = torch::randn({2, 3, 11, 8}),
             v = torch::randn({2, 3, 11, 8});
  const auto fused = compat::causal_attention(q, k, v, 0.1, /*training=*/false);
  const auto ref = compat::causal_attention_reference(q, k, v);
  EXPECT_TRUE(torch::allclose(fused, ref, 1e-5, 1e-6));
  // Row 0 attends only to position 0.
  EXPECT_TRUE(torch::allclose(ref.select(2, 0), v.select(2, 0), 1e-5, 1e-6));
}

TEST(Loss, MaskedMeanOverRealVocabOnly) {
  const int64_t vocab = 5;
  torch::manual_seed(1);
  auto logits = torch::randn({2, 3, 8});
  const auto labels = torch::tensor({{1, 4, 0}, {2, -100, 3}}, torch::kLong);
  const auto mask = torch::tensor({{1.f, 1.f, 0.f}, {1.f, 0.f, 1.f}});
  // Expected, by hand: log-softmax over the first 5 columns only.
  double sum = 0;
  int n = 0;
  for (int b = 0; b < 2; ++b) {
    for (int t = 0; t < 3; ++t) {
      if (mask[b][t].item<float>() == 0) continue;
      const auto row = logits[b][t].narrow(0, 0, vocab);
      sum += -torch::log_softmax(row, 0)[labels[b][t].item<int64_t>()].item<double>();
      ++n;
    }
  }
  const double loss = lm_loss(logits, labels, mask, vocab).item<double>();
  EXPECT_NEAR(loss, sum / n, 1e-6);
  // Padded columns never count: huge values there change nothing.
  logits.narrow(2, vocab, 3).fill_(1e4);
  EXPECT_NEAR(lm_loss(logits, labels, mask, vocab).item<double>(), loss, 1e-6);
  // Masked-out labels never count.
  auto other = labels.clone();
  other[0][2] = 3;
  EXPECT_NEAR(lm_loss(logits, other, mask, vocab).item<double>(), loss, 1e-6);
  EXPECT_NE(error_of([&] {
              lm_loss(logits, labels, mask.narrow(1, 0, 2), vocab);
            }).find("does not match labels"),
            std::string::npos);
}

TEST(Loss, AllPositionsShiftedLikeHuggingFace) {
  const int64_t vocab = 6;
  torch::manual_seed(2);
  const auto logits = torch::randn({2, 4, 8});
  const auto ids = torch::randint(0, vocab, {2, 4}, torch::kLong);
  double sum = 0;
  for (int b = 0; b < 2; ++b) {
    for (int t = 0; t < 3; ++t) {
      sum -= torch::log_softmax(logits[b][t].narrow(0, 0, vocab), 0)[ids[b][t + 1].item<int64_t>()]
                 .item<double>();
    }
  }
  EXPECT_NEAR(lm_loss_all(logits, ids, vocab).item<double>(), sum / 6, 1e-6);
  EXPECT_NEAR(lm_loss_all_sum(logits, ids, vocab).item<double>(), sum, 1e-5);
  // Same as lm_loss with labels = ids shifted and a mask that drops the last position.
  const auto labels = torch::cat({ids.narrow(1, 1, 3), torch::zeros({2, 1}, torch::kLong)}, 1);
  auto mask = torch::ones({2, 4});
  mask.select(1, 3).zero_();
  EXPECT_NEAR(lm_loss(logits, labels, mask, vocab).item<double>(), sum / 6, 1e-6);
}

TEST(GPT2, TrainingStepReducesLossAndLeavesPaddedRowsAlone) {
  auto c = small_config();
  GPT2 model(c);
  model->reset_parameters(1);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-2).weight_decay(0.0));
  const auto ids = random_ids(c, 4, 8, 9);
  double first = 0, last = 0;
  for (int i = 0; i < 10; ++i) {
    opt.zero_grad();
    auto loss = model->lm_loss_all(model->forward(ids), ids);
    loss.backward();
    if (i == 0) {
      first = loss.item<double>();
      EXPECT_EQ(model->wte->weight.grad().narrow(0, c.vocab_size, 28).abs().sum().item<double>(),
                0);
    }
    last = loss.item<double>();
    opt.step();
  }
  EXPECT_NEAR(first, std::log(static_cast<double>(c.vocab_size)), 0.2);
  EXPECT_LT(last, first - 0.5);
}

}  // namespace
}  // namespace gpt2p::model
