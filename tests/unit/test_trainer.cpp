// The data-parallel trainer's pieces without MPI: the scaled loss, gradient syncs over a fake
// two-rank communicator, TrainData's partitions and global target counts, and the evaluator.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <set>

#include "gpt2p/comm/communicator.h"
#include "gpt2p/core/error.h"
#include "gpt2p/data/batch.h"
#include "gpt2p/data/bleu.h"
#include "gpt2p/data/dataset_file.h"
#include "gpt2p/data/partitioner.h"
#include "gpt2p/model/gpt2.h"
#include "gpt2p/parallel/data_parallel/grad_sync.h"
#include "gpt2p/parallel/train/context.h"
#include "gpt2p/parallel/train/data.h"
#include "gpt2p/parallel/train/evaluator.h"
#include "support/errors.h"
#include "support/small_model.h"
#include "support/temp_dir.h"

namespace gpt2p::parallel {
namespace {

using gpt2p::testing::error_of;

namespace fs = std::filesystem;

// Vocabulary 100 pads to 128: padded logit columns exist.
model::GPT2Config small_config(int64_t vocab = 100) {
  return gpt2p::testing::small_model(2, vocab, 32, 2, 12);
}

// ---- scaled_loss -------------------------------------------------------------------------------

TEST(ScaledLoss, IsTheMaskedSumTimesWorldOverGlobalTargets) {
  torch::manual_seed(3);
  const auto logits = torch::randn({2, 5, 64});
  const auto labels = torch::randint(0, 50, {2, 5}, torch::kLong);
  const auto mask = torch::tensor({1, 1, 0, 1, 0, 0, 1, 1, 1, 0}, torch::kFloat32).view({2, 5});
  const double mean = model::lm_loss(logits, labels, mask, 50).item<double>();
  // 6 local targets of 20 global, 4 ranks: sum * 4 / 20.
  EXPECT_NEAR(scaled_loss(logits, labels, mask, 50, 20, 4).item<double>(), mean * 6 * 4 / 20, 1e-5);
  // One rank holding the whole batch: the plain mean.
  EXPECT_NEAR(scaled_loss(logits, labels, mask, 50, 6, 1).item<double>(), mean, 1e-6);
  // Padded logit columns (>= vocab_size) never count.
  auto padded = logits.clone();
  padded.narrow(-1, 50, 14).fill_(100.0);
  EXPECT_NEAR(scaled_loss(padded, labels, mask, 50, 20, 4).item<double>(),
              scaled_loss(logits, labels, mask, 50, 20, 4).item<double>(), 1e-6);
}

TEST(ScaledLoss, AveragedRankGradientsAreTheGlobalMeanGradient) {
  // Two "ranks" with 4 and 2 target tokens: averaging their scaled-loss gradients gives the
  // gradient of the mean over all 6, which averaging per-rank means would not.
  torch::manual_seed(4);
  const auto logits = torch::randn({2, 4, 64}, torch::requires_grad());
  const auto labels = torch::randint(0, 64, {2, 4}, torch::kLong);
  const auto mask = torch::tensor({1, 1, 1, 1, 0, 1, 0, 1}, torch::kFloat32).view({2, 4});
  const auto global =
      torch::autograd::grad({model::lm_loss(logits, labels, mask, 64)}, {logits})[0];
  torch::Tensor avg = torch::zeros_like(logits);
  torch::Tensor naive = torch::zeros_like(logits);
  for (int r = 0; r < 2; ++r) {
    auto part = torch::zeros({2, 4});
    part[r] = mask[r];
    avg += torch::autograd::grad({scaled_loss(logits, labels, part, 64, 6, 2)}, {logits})[0] / 2;
    naive += torch::autograd::grad({model::lm_loss(logits, labels, part, 64)}, {logits})[0] / 2;
  }
  EXPECT_TRUE(torch::allclose(avg, global, 1e-5, 1e-7));
  EXPECT_FALSE(torch::allclose(naive, global, 1e-3, 1e-5)) << "the test case must discriminate";
}

// ---- GradSync over a fake communicator
// ------------------------------------------------------------

// Rank 0 of a two-rank world whose other rank's gradients are all zero: avg halves the tensor.
// Records every reduction.
class HalvingComm final : public comm::Communicator {
 public:
  HalvingComm() : Communicator(Topology{0, 2, 0, 2, "fake"}) {}
  comm::Backend backend() const override { return comm::Backend::kMpi; }
  std::string backend_name() const override { return "fake"; }
  torch::Device device() const override { return torch::kCPU; }
  comm::WorkPtr all_reduce_async(torch::Tensor& t, comm::ReduceOp op) override {
    check_tensor(t, "all_reduce");
    reductions.push_back({t.numel(), t.scalar_type()});
    events.push_back("reduce " + std::to_string(t.numel()));
    if (op == comm::ReduceOp::kAvg) t.copy_(t.to(torch::kFloat32) / 2);
    return std::make_unique<Done>();
  }
  void broadcast(torch::Tensor& /*t*/, int /*root*/) override {}
  // The other rank gathers zeros: token 0 with a zero gradient adds nothing.
  torch::Tensor all_gather(const torch::Tensor& t) override {
    events.push_back("gather " + std::to_string(t.numel()));
    return torch::stack({t, torch::zeros_like(t)});
  }
  comm::WorkPtr send_async(const torch::Tensor&, int, int) override {
    GPT2P_FAIL("send", "unused");
  }
  comm::WorkPtr recv_async(torch::Tensor&, int, int) override { GPT2P_FAIL("recv", "unused"); }
  void barrier() override {}

  struct Reduction {
    int64_t numel;
    torch::ScalarType dtype;
  };
  std::vector<Reduction> reductions;
  std::vector<std::string> events;  // "reduce <numel>" and "gather <numel>", in call order

 private:
  struct Done final : comm::Work {
    void wait() override {}
    bool is_completed() override { return true; }
  };
};

struct SyncRun {
  std::vector<torch::Tensor> grads;
  int64_t params_numel = 0;
};

// Backward of `micro_steps` micro-batches on a fresh model, through sync `mode`.
// `sparse`: the tied weight's lookup part through the embedding sink (grad_sync.h).
// "none" | "per-param" | "bucketed".
std::unique_ptr<GradSync> sync_of(const std::string& mode, comm::Communicator* comm,
                                  const std::vector<torch::Tensor>& params, double bucket_mb,
                                  torch::ScalarType dtype, const torch::Tensor& tied = {}) {
  if (mode == "none") return make_no_sync();
  return make_grad_sync(*from_name<GradSyncMode>(mode), comm, params, bucket_mb, dtype, tied);
}

SyncRun run_sync(const std::string& mode, comm::Communicator* comm, double bucket_mb,
                 torch::ScalarType dtype, int micro_steps, bool sparse = false) {
  model::GPT2 model(small_config());
  model->reset_parameters(5);
  auto params = model->parameters();
  auto sync = sync_of(mode, comm, params, bucket_mb, dtype,
                      sparse ? model->tied_parameter() : torch::Tensor());
  if (auto sink = sync->embedding_sink()) model->set_embedding_grad_sink(std::move(sink));
  EXPECT_EQ(static_cast<bool>(sync->embedding_sink()), sparse && mode == "bucketed");
  torch::manual_seed(6);
  for (int k = 0; k < micro_steps; ++k) {
    const auto ids = torch::randint(0, 100, {2, 8}, torch::kLong);
    const auto loss = model->lm_loss_all(model->forward(ids), ids);
    sync->begin_backward(k + 1 == micro_steps);
    loss.backward();
    if (k + 1 < micro_steps) sync->end_backward();  // a no-op before the last micro-step
  }
  sync->end_backward();
  sync->finish_step();
  SyncRun r;
  for (const auto& p : params) {
    r.grads.push_back(p.grad().clone());
    r.params_numel += p.numel();
  }
  return r;
}

void expect_halved(const SyncRun& got, const SyncRun& local, double tol) {
  ASSERT_EQ(got.grads.size(), local.grads.size());
  for (size_t i = 0; i < got.grads.size(); ++i) {
    EXPECT_TRUE(torch::allclose(got.grads[i], local.grads[i] / 2, tol, 1e-9)) << "parameter " << i;
  }
}

TEST(GradSync, NoneLeavesGradientsAlone) {
  const auto a = run_sync("none", nullptr, 25, torch::kFloat32, 1);
  const auto b = run_sync("none", nullptr, 25, torch::kFloat32, 1);
  for (size_t i = 0; i < a.grads.size(); ++i) EXPECT_TRUE(torch::equal(a.grads[i], b.grads[i]));
  EXPECT_EQ(make_no_sync()->name(), "none");
}

TEST(GradSync, PerParamAveragesEveryParameterOnce) {
  const auto local = run_sync("none", nullptr, 25, torch::kFloat32, 1);
  HalvingComm comm;
  const auto got = run_sync("per-param", &comm, 25, torch::kFloat32, 1);
  expect_halved(got, local, 0);
  ASSERT_EQ(comm.reductions.size(), local.grads.size());
  for (size_t i = 0; i < comm.reductions.size(); ++i) {
    EXPECT_EQ(comm.reductions[i].numel, local.grads[i].numel());
    EXPECT_EQ(comm.reductions[i].dtype, torch::kFloat32);
  }
}

TEST(GradSync, BucketedCoversEveryElementInSeveralBuckets) {
  const auto local = run_sync("none", nullptr, 25, torch::kFloat32, 1);
  HalvingComm one;
  expect_halved(run_sync("bucketed", &one, 25, torch::kFloat32, 1), local, 0);
  ASSERT_EQ(one.reductions.size(), 1U);
  EXPECT_EQ(one.reductions[0].numel, local.params_numel);

  HalvingComm many;
  const double mb = 0.01;  // 2621 floats
  expect_halved(run_sync("bucketed", &many, mb, torch::kFloat32, 1), local, 0);
  EXPECT_GT(many.reductions.size(), 3U);
  int64_t total = 0;
  for (const auto& r : many.reductions) total += r.numel;
  EXPECT_EQ(total, local.params_numel) << "every gradient element travels exactly once";
}

TEST(GradSync, AccumulationSyncsOnlyTheLastMicroStep) {
  const auto local = run_sync("none", nullptr, 25, torch::kFloat32, 2);
  for (const char* mode : {"per-param", "bucketed"}) {
    SCOPED_TRACE(mode);
    HalvingComm comm;
    expect_halved(run_sync(mode, &comm, 0.01, torch::kFloat32, 2), local, 1e-6);
    int64_t total = 0;
    for (const auto& r : comm.reductions) total += r.numel;
    EXPECT_EQ(total, local.params_numel) << "one reduction per element for two micro-steps";
  }
}

TEST(GradSync, Bf16ReducesInBf16) {
  const auto local = run_sync("none", nullptr, 25, torch::kFloat32, 1);
  for (const char* mode : {"per-param", "bucketed"}) {
    SCOPED_TRACE(mode);
    HalvingComm comm;
    const auto got = run_sync(mode, &comm, 0.01, torch::kBFloat16, 1);
    expect_halved(got, local, 1e-2);
    for (const auto& r : comm.reductions) EXPECT_EQ(r.dtype, torch::kBFloat16);
    EXPECT_EQ(got.grads[0].scalar_type(), torch::kFloat32);
  }
}

TEST(GradSync, SparseEmbeddingSyncReducesTheHeadPartFirstAndGathersTheLookup) {
  for (int micro_steps : {1, 2}) {
    SCOPED_TRACE(micro_steps);
    const auto local = run_sync("none", nullptr, 25, torch::kFloat32, micro_steps);
    HalvingComm comm;
    expect_halved(run_sync("bucketed", &comm, 0.01, torch::kFloat32, micro_steps, true), local,
                  1e-6);
    const auto wte = std::to_string(small_config().padded_vocab_size() * 32);
    // Every micro-step's 2 x 8 lookups, ids and gradient rows, gathered once at the sync.
    const std::string ids = "gather " + std::to_string(micro_steps * 16);
    const std::string rows = "gather " + std::to_string(micro_steps * 16 * 32);
    const auto at = [&](const std::string& e) {
      return std::find(comm.events.begin(), comm.events.end(), e) - comm.events.begin();
    };
    ASSERT_LT(at("reduce " + wte), static_cast<std::ptrdiff_t>(comm.events.size()));
    ASSERT_LT(at(ids), static_cast<std::ptrdiff_t>(comm.events.size()));
    ASSERT_LT(at(rows), static_cast<std::ptrdiff_t>(comm.events.size()));
    EXPECT_EQ(at("reduce " + wte), 0) << "the tied weight's head part goes first";
    int64_t total = 0;
    for (const auto& r : comm.reductions) total += r.numel;
    EXPECT_EQ(total, local.params_numel) << "every element still reduced exactly once";
  }
  // per-param and dense bucketed ignore the tied weight: no sink.
  HalvingComm comm;
  run_sync("per-param", &comm, 25, torch::kFloat32, 1, true);
  for (const auto& e : comm.events) EXPECT_EQ(e.rfind("gather", 0), std::string::npos) << e;
}

TEST(GradSync, ReducedGradientsViewTheirBucketsUntilTheNextBackward) {
  model::GPT2 model(small_config());
  auto params = model->parameters();
  HalvingComm comm;
  auto sync = make_grad_sync(GradSyncMode::kBucketed, &comm, params, 25, torch::kFloat32);
  const auto ids = torch::randint(0, 100, {2, 8}, torch::kLong);
  const auto step = [&] {
    sync->begin_backward(true);
    model->lm_loss_all(model->forward(ids), ids).backward();
    sync->end_backward();
    sync->finish_step();
  };
  step();
  const auto first = params[0].grad().clone();
  EXPECT_TRUE(params[0].grad().is_alias_of(params[1].grad())) << "one bucket, no copies";
  // zero_grad() keeps .grad: the next backward must not accumulate into the bucket it reduces.
  for (auto& p : params) p.mutable_grad().zero_();
  step();
  EXPECT_TRUE(torch::allclose(params[0].grad(), first, 1e-6, 1e-9));
}

TEST(GradSync, ErrorsNameTheProblem) {
  model::GPT2 model(small_config());
  const auto params = model->parameters();
  HalvingComm comm;
  EXPECT_NE(error_of([&] {
              make_grad_sync(GradSyncMode::kPerParam, nullptr, params, 25, torch::kFloat32);
            }).find("gradient sync 'per-param' needs a communicator"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              make_grad_sync(GradSyncMode::kBucketed, &comm, params, 0, torch::kFloat32);
            }).find("--bucket-mb 0 is not positive"),
            std::string::npos);
  model::GPT2 other(small_config());
  EXPECT_NE(error_of([&] {
              make_grad_sync(GradSyncMode::kBucketed, &comm, params, 25, torch::kFloat32,
                             other->tied_parameter());
            }).find("tied embedding weight is not among the parameters"),
            std::string::npos);
}

// ---- TrainData
// -------------------------------------------------------------------------------------

using gpt2p::testing::TempDir;

// n examples; example i starts with token 1000 + i (so a batch row names its example) and has
// 1 + (i * 7) % 9 target tokens.
data::Split numbered_split(int n) {
  data::Split s;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> tgt(static_cast<size_t>(1 + (i * 7) % 9), 20 + i);
    s.add({1000 + i, 5}, tgt, "de" + std::to_string(i), "en" + std::to_string(i));
  }
  return s;
}

std::string write_numbered_dataset(const TempDir& dir, int n) {
  data::DatasetMeta meta;
  meta.tokenizer_identity = "test-tokenizer";
  meta.vocab_size = 50260;
  meta.source = "test_trainer";
  const auto split = numbered_split(n);
  data::write_dataset_file(dir / "d.h5", meta,
                           {{"train", split}, {"validation", split}, {"test", split}});
  return dir / "d.h5";
}

TrainDataOptions options_for(const std::string& path) {
  TrainDataOptions o;
  o.path = path;
  o.tokenizer_identity = "test-tokenizer";
  o.vocab_size = 50260;
  o.global_batch = 6;
  o.seq_len = 10;
  o.seed = 3;
  return o;
}

constexpr int64_t kSeq = 10;

std::vector<int64_t> examples_of(const data::Batch& b) {
  std::vector<int64_t> v;
  for (int64_t row = 0; row < b.batch_size; ++row)
    v.push_back(b.inputs[static_cast<size_t>(row * kSeq)] - 1000);
  return v;
}

TEST(TrainData, GlobalTargetsAreTheSumOverRanksAndPartitionsAreDisjoint) {
  TempDir dir;
  const auto opts = options_for(write_numbered_dataset(dir, 24));
  constexpr int kWorld = 3;
  std::vector<TrainData> ranks;
  for (int r = 0; r < kWorld; ++r) ranks.emplace_back(opts, r, kWorld);
  ASSERT_EQ(ranks[0].local_batch(), 2);
  ASSERT_EQ(ranks[0].batches_per_epoch(), 4);  // 8 examples per rank
  std::vector<std::set<int64_t>> seen(kWorld);
  std::set<int64_t> global_seen;
  for (int64_t step = 0; step < 4; ++step) {
    int64_t sum = 0;
    std::vector<int64_t> global;
    for (int r = 0; r < kWorld; ++r) {
      const auto s = ranks[r].next();
      ASSERT_EQ(s.batch.batch_size, 2);
      sum += s.batch.target_tokens;
      global.push_back(s.global_target_tokens);
      for (int64_t e : examples_of(s.batch)) {
        EXPECT_TRUE(seen[r].insert(e).second) << "rank " << r << " saw example " << e << " twice";
        EXPECT_TRUE(global_seen.insert(e).second) << "example " << e << " on two ranks";
      }
    }
    // Every rank knows the same global count, without communicating.
    EXPECT_EQ(global, std::vector<int64_t>(kWorld, sum)) << "step " << step;
  }
  for (int r = 0; r < kWorld; ++r) {
    const auto part = data::partition_dataset(r, kWorld, 24, 6, opts.seed);
    EXPECT_EQ(seen[r], std::set<int64_t>(part.indices.begin(), part.indices.end())) << "rank " << r;
  }
  EXPECT_EQ(ranks[0].position(), (data::SamplerPosition{1, 0}));
}

TEST(TrainData, EveryRankReportsTheSameGlobalCount) {
  TempDir dir;
  const auto opts = options_for(write_numbered_dataset(dir, 24));
  TrainData a(opts, 0, 2);
  TrainData b(opts, 1, 2);
  for (int step = 0; step < 5; ++step) {  // crosses an epoch boundary (4 batches per epoch)
    const auto sa = a.next();
    const auto sb = b.next();
    EXPECT_EQ(sa.global_target_tokens, sb.global_target_tokens);
    EXPECT_EQ(sa.global_target_tokens, sa.batch.target_tokens + sb.batch.target_tokens);
  }
}

TEST(TrainData, SetPositionResumesTheSameBatch) {
  TempDir dir;
  const auto opts = options_for(write_numbered_dataset(dir, 24));
  TrainData fresh(opts, 1, 2);
  fresh.next();
  const auto second = fresh.next();
  TrainData resumed(opts, 1, 2);
  resumed.set_position({0, 1});
  const auto again = resumed.next();
  EXPECT_EQ(again.batch.inputs, second.batch.inputs);
  EXPECT_EQ(again.global_target_tokens, second.global_target_tokens);
}

TEST(TrainData, MaxTrainPairsAndErrors) {
  TempDir dir;
  auto opts = options_for(write_numbered_dataset(dir, 24));
  opts.max_train_pairs = 12;
  EXPECT_EQ(TrainData(opts, 0, 2).train_pairs(), 12);
  EXPECT_EQ(TrainData(opts, 0, 2).batches_per_epoch(), 2);  // 6 examples, batches of 3
  opts.global_batch = 18;
  const auto few = error_of([&] { (void)TrainData(opts, 0, 2); });
  EXPECT_NE(few.find("has 12 training pairs"), std::string::npos) << few;
  EXPECT_NE(few.find("fewer than one global batch of 18"), std::string::npos) << few;
  EXPECT_NE(few.find("--max-train-pairs"), std::string::npos) << few;
  auto other = options_for(dir / "d.h5");
  other.tokenizer_identity = "another";
  const auto tok = error_of([&] { (void)TrainData(other, 0, 1); });
  EXPECT_NE(tok.find("test-tokenizer"), std::string::npos) << tok;
  EXPECT_NE(tok.find("another"), std::string::npos) << tok;
}

// ---- Evaluator
// ---------------------------------------------------------------------------------------

TEST(Evaluator, ValidationLossIsTheTokenWeightedMeanOfLmLoss) {
  const auto c = small_config(50260);  // the specials are real ids
  model::GPT2 model(c);
  model->reset_parameters(9);
  model->eval();
  const auto split = numbered_split(7);
  const LogitsFn logits = [&](const torch::Tensor& ids) { return model->forward(ids); };
  for (int64_t max_pairs : {0, 5}) {
    SCOPED_TRACE(max_pairs);
    const int64_t n = max_pairs > 0 ? max_pairs : split.size();
    std::vector<int64_t> idx(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) idx[static_cast<size_t>(i)] = i;
    const auto b = data::make_batch(split, idx, kSeq, data::SpecialTokens{});
    const std::vector<int64_t> shape = {b.batch_size, kSeq};
    torch::NoGradGuard no_grad;
    const double want = model::lm_loss(model->forward(torch::tensor(b.inputs).view(shape)),
                                       torch::tensor(b.labels).view(shape),
                                       torch::tensor(b.mask).view(shape), c.vocab_size)
                            .item<double>();
    // Batches of 2: sizes 2, 2, ..., 1, with different target counts each.
    const auto got = validation_loss(logits, split, max_pairs, 2, kSeq, data::SpecialTokens{},
                                     c.vocab_size, torch::kCPU, nullptr);
    EXPECT_EQ(got.tokens, b.target_tokens);
    EXPECT_NEAR(got.loss, want, 1e-5);
    EXPECT_NEAR(got.perplexity, std::exp(want), 1e-4 * std::exp(want));
  }
}

TEST(Evaluator, TranslationsBleu) {
  EXPECT_TRUE(std::isnan(translations_bleu({})));
  EXPECT_NEAR(translations_bleu({{"de", "the cat sat on the mat", "the cat sat on the mat"}}), 100,
              1e-9);
  const std::vector<Translation> t = {{"a", "the dog is big", "the dog is very big"},
                                      {"b", "a house", "the house is old"}};
  EXPECT_DOUBLE_EQ(
      translations_bleu(t),
      data::corpus_bleu({"the dog is big", "a house"}, {"the dog is very big", "the house is old"})
          .score);
  EXPECT_LT(translations_bleu(t), 100);
}

}  // namespace
}  // namespace gpt2p::parallel
