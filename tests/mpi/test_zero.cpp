// ZeRO-1 (zero.h) at 2, 3 and 4 ranks against the unsharded data-parallel step:
//  * three AdamW steps with the sharded state equal the bucketed sync + AdamW of every rank
//    (fp32, 1e-6 of the parameters' scale; bit for bit at 2 ranks without clipping) and are no
//    farther than it from one rank on the whole batch, with several
//    buckets or one, the tied weight's lookup part gathered (sparse), gradient accumulation, a
//    clipping norm that bites, and bf16 reductions (close); the replicas stay bitwise equal;
//  * the gathered state equals the unsharded optimizer's, and a fresh sharded optimizer loaded
//    from it continues bit for bit;
//  * each rank holds about 1/N of the AdamW state;
//  * dp_train --zero 1 trains as dp_train, resumes, and its checkpoint resumes without ZeRO;
//    pp_train --dp 2 --zero 1 trains as the unsharded hybrid and resumes.
#include <gtest/gtest.h>

#include <random>

#include "gpt2p/comm/communicator.h"
#include "gpt2p/compat/adamw.h"
#include "gpt2p/data/batch.h"
#include "gpt2p/model/gpt2.h"
#include "gpt2p/parallel/data_parallel/grad_norm.h"
#include "gpt2p/parallel/data_parallel/grad_sync.h"
#include "gpt2p/parallel/data_parallel/zero.h"
#include "gpt2p/parallel/train/context.h"
#include "gpt2p/parallel/trainers/dp_trainer.h"
#include "gpt2p/parallel/trainers/pp_trainer.h"
#include "support/small_model.h"
#include "support/synthetic_split.h"
#include "support/trainer_fixture.h"

namespace gpt2p::parallel {
namespace {

constexpr int64_t kSeqLen = 12;
constexpr int64_t kGlobalBatch = 12;  // divides over 2, 3 and 4 ranks
constexpr int kSteps = 3;

model::GPT2Config small_config() {
  // The tiny preset's vocabulary (50260): the special tokens are real ids.
  return gpt2p::testing::small_model(2, model::preset("tiny").vocab_size, 32, 2, kSeqLen);
}

data::Split synthetic_split() { return gpt2p::testing::synthetic_split(kGlobalBatch, 4321); }

struct Spec {
  bool zero = true;
  double bucket_mb = 0.01;  // many buckets of the 1.7M-parameter model
  torch::ScalarType reduce_dtype = torch::kFloat32;
  int grad_accum = 1;
  bool sparse = false;
  double clip = 0;  // off
};

struct Trained {
  std::vector<torch::Tensor> params;          // after kSteps steps
  std::unique_ptr<compat::FusedAdamW> state;  // the unsharded optimizer state
};

const auto kAdam = torch::optim::AdamWOptions(3e-3).weight_decay(0.1);

// kSteps AdamW steps on rows [first, first + count) of the split, as a rank of `comm` (null: one
// rank), all steps on the same batch.
Trained train(const data::Split& split, int64_t first, int64_t count, int64_t global_targets,
              comm::Communicator* comm, const Spec& spec) {
  const int world = comm != nullptr ? comm->size() : 1;
  model::GPT2 model(small_config());
  model->reset_parameters(7);
  auto params = model->parameters();
  compat::FusedAdamW plain(params, kAdam);
  const auto tied = spec.sparse ? model->tied_parameter() : torch::Tensor();
  std::unique_ptr<ShardedAdamW> zero;
  std::unique_ptr<GradSync> sync = make_no_sync();
  if (spec.zero) {
    ZeroOptions o;
    o.adam = kAdam;
    o.buckets.bucket_mb = spec.bucket_mb;
    o.buckets.dtype = spec.reduce_dtype;
    o.sparse_tied = tied;
    zero = std::make_unique<ShardedAdamW>(params, *comm, o);
    if (auto sink = zero->embedding_sink()) model->set_embedding_grad_sink(sink);
  } else if (comm != nullptr) {
    sync = make_grad_sync(GradSyncMode::kBucketed, comm, params, spec.bucket_mb, spec.reduce_dtype,
                          tied);
    if (auto sink = sync->embedding_sink()) model->set_embedding_grad_sink(sink);
  }
  std::vector<int64_t> rows(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) rows[static_cast<size_t>(i)] = first + i;
  const auto batch = data::make_batch(split, rows, kSeqLen, data::SpecialTokens{});
  const std::vector<int64_t> shape = {count, kSeqLen};
  const auto inputs = torch::tensor(batch.inputs).view(shape);
  const auto labels = torch::tensor(batch.labels).view(shape);
  const auto mask = torch::tensor(batch.mask).view(shape);
  const int64_t micro = count / spec.grad_accum;
  for (int step = 0; step < kSteps; ++step) {
    for (int k = 0; k < spec.grad_accum; ++k) {
      const auto logits = model->forward(inputs.narrow(0, k * micro, micro));
      const auto loss =
          scaled_loss(logits, labels.narrow(0, k * micro, micro), mask.narrow(0, k * micro, micro),
                      small_config().vocab_size, global_targets, world);
      const bool last = k + 1 == spec.grad_accum;
      zero ? zero->begin_backward(last) : sync->begin_backward(last);
      loss.backward();
    }
    if (zero) {
      zero->end_backward();
      if (spec.clip > 0) clip_sharded_grad_norm({zero.get()}, {}, {comm}, spec.clip);
      zero->step();
      zero->finish_step();
      zero->wait_params();
    } else {
      sync->end_backward();
      if (spec.clip > 0) clip_grad_norm_queued(params, spec.clip);
      plain.step();
      sync->finish_step();
    }
    for (auto& p : params) p.mutable_grad() = torch::Tensor();
  }
  Trained r;
  for (const auto& p : params) r.params.push_back(p.detach().clone());
  if (zero) {
    r.state = zero->full_state();
  } else {
    r.state = std::make_unique<compat::FusedAdamW>(params, kAdam);
    for (const auto& p : params) {
      const auto* st = compat::adamw_state(plain, p);
      compat::set_adamw_state(*r.state, p, st->step(), st->exp_avg().clone(),
                              st->exp_avg_sq().clone());
    }
  }
  return r;
}

// max |a - b| over every element of the lists, relative to the largest |b| (the model's scale:
// its LayerNorm gains, ~1). Per tensor it would not do: the attention's key bias has no gradient
// in exact arithmetic, and Adam's normalisation turns the rounding noise of two summation orders
// into moves of the bias itself.
double max_rel_diff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0, scale = 1e-30;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    worst = std::max(
        worst, (a[i].to(torch::kFloat64) - b[i].to(torch::kFloat64)).abs().max().item<double>());
    scale = std::max(scale, b[i].abs().max().item<double>());
  }
  return worst / scale;
}

std::vector<torch::Tensor> moments(const Trained& r, const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  for (const auto& p : params) {
    const auto* st = compat::adamw_state(*r.state, p);
    EXPECT_NE(st, nullptr);
    if (st == nullptr) continue;
    out.push_back(st->exp_avg());
    out.push_back(st->exp_avg_sq());
  }
  return out;
}

class Zero : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    torch::set_num_threads(1);
    split_ = new data::Split(synthetic_split());
    std::vector<int64_t> all(kGlobalBatch);
    for (int64_t i = 0; i < kGlobalBatch; ++i) all[static_cast<size_t>(i)] = i;
    targets_ = data::make_batch(*split_, all, kSeqLen, data::SpecialTokens{}).target_tokens;
  }
  static void TearDownTestSuite() { delete split_; }

  Trained run(const Spec& spec) {
    const int64_t local = kGlobalBatch / world;
    return train(*split_, rank * local, local, targets_, comm.get(), spec);
  }
  Trained one_rank(const Spec& spec) {
    Spec s = spec;
    s.zero = false;
    return train(*split_, 0, kGlobalBatch, targets_, nullptr, s);
  }

  // Sharded equals unsharded at this world within `tol`, both one rank within 1e-5 (fp32), and
  // every rank holds the same parameters.
  void expect_equals_plain(const Spec& spec, double tol) {
    Spec plain_spec = spec;
    plain_spec.zero = false;
    const auto zero = run(spec);
    const auto plain = run(plain_spec);
    EXPECT_LE(max_rel_diff(zero.params, plain.params), tol) << "parameters";
    if (spec.reduce_dtype == torch::kFloat32) {
      // One rank sums the batch's gradient in another order: after three Adam steps the unsharded
      // data-parallel run is up to ~3e-5 from it at 3 ranks, and ZeRO must be no farther.
      const auto one = one_rank(spec);
      const double plain_off = max_rel_diff(plain.params, one.params);
      EXPECT_LE(max_rel_diff(zero.params, one.params), plain_off + 1e-6)
          << "against one rank on the whole batch (the unsharded step is " << plain_off << " off)";
      EXPECT_LE(plain_off, 1e-4);
    }
    for (const auto& p : zero.params) {
      const auto all = comm->all_gather(p);
      for (int r = 1; r < world; ++r) ASSERT_TRUE(torch::equal(all[r], all[0])) << "rank " << r;
    }
  }

  std::unique_ptr<comm::Communicator> comm = comm::make_mpi_communicator();
  int rank = comm->rank();
  int world = comm->size();
  static inline data::Split* split_ = nullptr;
  static inline int64_t targets_ = 0;
};

TEST_F(Zero, SeveralBucketsEqualThePlainStep) { expect_equals_plain({}, 1e-6); }

TEST_F(Zero, OneBucketEqualsThePlainStep) {
  Spec s;
  s.bucket_mb = 25;
  expect_equals_plain(s, 1e-6);
}

TEST_F(Zero, SparseEmbeddingSyncEqualsThePlainStep) {
  Spec s;
  s.sparse = true;
  expect_equals_plain(s, 1e-6);
}

TEST_F(Zero, GradAccumulationEqualsThePlainStep) {
  if (kGlobalBatch / world % 2 != 0) GTEST_SKIP() << "a rank's batch does not split in two";
  Spec s;
  s.grad_accum = 2;
  s.sparse = true;
  expect_equals_plain(s, 1e-6);
}

TEST_F(Zero, ClippingEqualsThePlainStep) {
  Spec s;
  s.clip = 0.05;  // well below the gradients' norm: every step is scaled
  expect_equals_plain(s, 1e-6);
}

TEST_F(Zero, Bf16ReductionsStayClose) {
  Spec s;
  s.reduce_dtype = torch::kBFloat16;
  expect_equals_plain(s, 2e-2);
}

TEST_F(Zero, GatheredStateEqualsTheUnshardedOneAndReloads) {
  Spec s;
  s.sparse = true;
  const auto zero = run(s);
  Spec p = s;
  p.zero = false;
  const auto plain = run(p);
  // Both states are keyed by their own run's parameters: compare in parameter order.
  const auto zp = zero.state->param_groups().front().params();
  const auto pp = plain.state->param_groups().front().params();
  EXPECT_LE(max_rel_diff(moments(zero, zp), moments(plain, pp)), 1e-6);
  EXPECT_EQ(compat::adamw_state(*zero.state, zp.front())->step(), kSteps);

  // A new sharded optimizer over a model holding these parameters, loaded with the gathered
  // state, holds the same shards: gathering again gives the same bits.
  model::GPT2 model(small_config());
  {
    torch::NoGradGuard no_grad;
    auto params = model->parameters();
    for (size_t i = 0; i < params.size(); ++i) params[i].copy_(zero.params[i]);
  }
  ZeroOptions o;
  o.adam = kAdam;
  o.buckets.bucket_mb = 0.003;  // another layout: the state is resharded
  ShardedAdamW fresh(model->parameters(), *comm, o);
  compat::FusedAdamW loaded(model->parameters(), kAdam);  // as a checkpoint load would fill it
  for (size_t i = 0; i < zp.size(); ++i) {
    const auto* st = compat::adamw_state(*zero.state, zp[i]);
    compat::set_adamw_state(loaded, model->parameters()[i], st->step(), st->exp_avg().clone(),
                            st->exp_avg_sq().clone());
  }
  fresh.load_state(loaded);
  const auto again = fresh.full_state();
  const auto params = model->parameters();
  const auto a = moments(zero, zp);
  std::vector<torch::Tensor> b;
  for (const auto& q : params) {
    b.push_back(compat::adamw_state(*again, q)->exp_avg());
    b.push_back(compat::adamw_state(*again, q)->exp_avg_sq());
  }
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << i;
}

TEST_F(Zero, EachRankHoldsItsShareOfTheState) {
  model::GPT2 model(small_config());
  ZeroOptions o;
  o.adam = kAdam;
  o.buckets.bucket_mb = 1;
  ShardedAdamW zero(model->parameters(), *comm, o);
  const double share =
      static_cast<double>(zero.state_bytes()) / static_cast<double>(zero.unsharded_state_bytes());
  // 1/N, plus the padding that aligns every shard.
  EXPECT_GE(share, 1.0 / world);
  EXPECT_LE(share, 1.0 / world + 0.01);
}

class ZeroTrainer : public gpt2p::testing::TrainerTest {
 protected:
  TrainConfig dp(const std::string& out, int64_t steps, int zero) const {
    auto c = config(out, steps);
    c.data_parallel.bucket_mb = 0.05;
    c.data_parallel.zero = zero;
    return c;
  }
};

TEST_F(ZeroTrainer, DpTrainWithZeroTrainsAsWithoutAndResumes) {
  ASSERT_EQ(train_data_parallel(dp("plain", 3, 0), Program::kDataParallel, topo), 0);
  ASSERT_EQ(train_data_parallel(dp("c", 3, 1), Program::kDataParallel, topo), 0);
  expect_same_losses("plain", "c", 3);
  ASSERT_EQ(train_data_parallel(dp("a", 2, 1), Program::kDataParallel, topo), 0);
  auto b = dp("b", 3, 1);
  b.output.resume = dir + "/a/checkpoint";
  ASSERT_EQ(train_data_parallel(b, Program::kDataParallel, topo), 0);
  expect_resume_continues_the_run(1e-6);
  // The checkpoint is in the unsharded format: a run without ZeRO resumes from it.
  auto unsharded = dp("u", 3, 0);
  unsharded.output.resume = dir + "/a/checkpoint";
  ASSERT_EQ(train_data_parallel(unsharded, Program::kDataParallel, topo), 0);
  const auto u = gpt2p::testing::read_column(rank_file("u"), "/steps/loss");
  const auto full = gpt2p::testing::read_column(rank_file("c"), "/steps/loss");
  ASSERT_EQ(u.size(), 1U);
  EXPECT_NEAR(u[0], full[2], 1e-6 * full[2]);
}

TEST_F(ZeroTrainer, HybridWithZeroTrainsAsWithoutAndResumes) {
  const int n = comm->size();
  if (n % 2 != 0) GTEST_SKIP() << "2 replicas need an even number of ranks";
  const auto hybrid = [&](const std::string& out, int64_t steps, int zero) {
    auto c = config(out, steps, /*blocks=*/4);
    c.pipeline.dp = 2;
    c.pipeline.microbatches = 2;
    c.pipeline.partition = pipeline::PartitionKind::kBalanced;
    c.data_parallel.bucket_mb = 0.05;
    c.data_parallel.zero = zero;
    return c;
  };
  ASSERT_EQ(train_pipeline(hybrid("plain", 3, 0), topo), 0);
  ASSERT_EQ(train_pipeline(hybrid("c", 3, 1), topo), 0);
  expect_same_losses("plain", "c", 3);
  ASSERT_EQ(train_pipeline(hybrid("a", 2, 1), topo), 0);
  auto b = hybrid("b", 3, 1);
  b.output.resume = dir + "/a/checkpoint";
  ASSERT_EQ(train_pipeline(b, topo), 0);
  expect_resume_continues_the_run(1e-6);
}

}  // namespace
}  // namespace gpt2p::parallel
