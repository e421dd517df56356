// Hybrid data x pipeline parallelism on CPU ranks (pp_train --dp D): D replicas of a P-rank
// pipeline, each on its share of the batch, compute what one rank computes on the whole batch:
// the loss, every gradient once the replicas' gradients are summed
// (data_parallel/replica_grad_sync.h), and the parameters after an AdamW step; and the replicas
// stay bit for bit equal. Every D x P of the world size with D >= 2 (P = 1 included), for GPipe,
// 1F1B and the interleaved schedule, each with and without zero bubble.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gpt2p/comm/communicator.h"
#include "gpt2p/compat/adamw.h"
#include "gpt2p/compat/rng.h"
#include "gpt2p/model/checkpoint.h"
#include "gpt2p/parallel/data_parallel/replica_grad_sync.h"
#include "gpt2p/parallel/train/context.h"
#include "gpt2p/parallel/train/mesh.h"
#include "gpt2p/parallel/train/mesh_comms.h"
#include "gpt2p/parallel/trainers/pp_trainer.h"
#include "gpt2p/parallel/trainers/stage_split.h"
#include "gpt2p/pipeline/plan/zero_bubble.h"
#include "gpt2p/pipeline/runtime/executor.h"
#include "support/small_model.h"
#include "support/trainer_fixture.h"

namespace gpt2p {
namespace {

constexpr int64_t kRows = 24, kSeq = 8;  // 24 rows split over D = 2, 3, 4, 6, 8 replicas
constexpr uint64_t kSeed = 77;
constexpr double kLr = 1e-4;

comm::Communicator& world() {
  static auto comm = comm::make_mpi_communicator();
  return *comm;
}

// 8 blocks: room for 4 ranks x 2 stages.
model::GPT2Config config() { return testing::small_model(8, 500); }

double rel_diff(const torch::Tensor& a, const torch::Tensor& b) {
  const double scale = std::max(b.abs().max().item<double>(), 1e-8);
  return (a - b).abs().max().item<double>() / scale;
}

// The whole batch, the same on every rank.
pipeline::StageBatch global_batch() {
  auto gen = compat::make_cpu_generator(5);
  pipeline::StageBatch b;
  b.inputs = torch::randint(500, {kRows, kSeq}, gen, torch::kInt64);
  b.labels = torch::randint(500, {kRows, kSeq}, gen, torch::kInt64);
  b.mask = (torch::rand({kRows, kSeq}, gen) > 0.3).to(torch::kFloat32);
  b.mask[0][0] = 1.0f;
  b.global_target_tokens = static_cast<int64_t>(b.mask.sum().item<double>());
  return b;
}

// Replica d's rows; the loss stays scaled by the whole batch's target count, so that the sum over
// the replicas is the whole batch's mean.
pipeline::StageBatch replica_batch(const pipeline::StageBatch& b, const parallel::Mesh& mesh) {
  const int64_t rows = kRows / mesh.dp(), first = mesh.dp_rank() * rows;
  pipeline::StageBatch r = b;
  r.inputs = b.inputs.slice(0, first, first + rows).contiguous();
  r.labels = b.labels.slice(0, first, first + rows).contiguous();
  r.mask = b.mask.slice(0, first, first + rows).contiguous();
  return r;
}

struct Case {
  const char* name;
  pipeline::ScheduleKind kind;
  int per_rank;
  bool zero_bubble;
};

// One step of D replicas of a P-rank pipeline against the whole model on the whole batch.
void expect_hybrid_equals_one_rank(int dp, const Case& k) {
  const auto mesh = parallel::make_pipeline_mesh(world().size(), world().rank(), dp);
  const int n = mesh.pp(), v = k.per_rank;
  const int m = n;  // a multiple of the ranks, as the interleaved schedule needs
  SCOPED_TRACE(std::string(k.name) + " D=" + std::to_string(dp) + " P=" + std::to_string(n));
  parallel::check_mesh_batch(mesh, kRows, m);
  // The communicators pp_train makes (train/context.cpp): over MPI, two channels along pp (the
  // wrapping transfers reuse them here) and one along dp.
  const auto comms = parallel::MeshComms::make(mesh, {}, {1, 2});
  comm::Communicator& pipe = *comms.along(parallel::MeshDim::kPp);
  comm::Communicator& pipe_grad = *comms.along(parallel::MeshDim::kPp, 1);
  comm::Communicator& replicas = *comms.along(parallel::MeshDim::kDp);
  const auto cfg = config();
  const auto batch = global_batch();

  // The whole model on the whole batch, on every rank.
  model::GPT2 full(cfg);
  full->reset_parameters(kSeed);
  auto loss = parallel::scaled_loss(full->forward(batch.inputs), batch.labels, batch.mask,
                                    cfg.vocab_size, batch.global_target_tokens, 1);
  loss.backward();
  const double ref_loss = loss.item<double>();
  std::map<std::string, torch::Tensor> ref_grad, ref_param;
  for (const auto& p : full->named_parameters()) ref_grad[p.key()] = p.value().grad().clone();
  compat::FusedAdamW full_opt(full->parameters(), torch::optim::AdamWOptions(kLr));
  full_opt.step();
  for (const auto& p : full->named_parameters()) ref_param[p.key()] = p.value().detach().clone();

  // This rank's stages of its replica's pipeline.
  const auto split =
      parallel::stage_partition(pipeline::PartitionKind::kBalanced, cfg, n * v, kSeq, {}, v);
  std::vector<model::GPT2> models;
  std::vector<std::unique_ptr<pipeline::GptStage>> stages;
  std::vector<pipeline::Stage*> stage_ptrs;
  for (int c = 0; c < v; ++c) {
    models.emplace_back(cfg, split[static_cast<size_t>(mesh.pp_rank() + c * n)]);
    models.back()->reset_parameters(kSeed);
    stages.push_back(std::make_unique<pipeline::GptStage>(
        models.back(), m, torch::kFloat32, model::LossPositions::kTargets, k.zero_bubble));
    stage_ptrs.push_back(stages.back().get());
    stages.back()->set_batch(replica_batch(batch, mesh));
  }
  pipeline::CommTransport transport(pipe, pipe_grad, &pipe, &pipe_grad);
  const auto schedule =
      k.zero_bubble ? pipeline::make_zero_bubble_schedule(
                          k.kind, m, n, v,
                          pipeline::zero_bubble_costs(split, static_cast<int>(cfg.n_layer),
                                                      static_cast<int>(cfg.n_embd), kSeq,
                                                      static_cast<int>(cfg.padded_vocab_size()), 1))
                    : pipeline::make_schedule(k.kind, m, n, v);
  pipeline::Executor executor(stage_ptrs, transport, schedule[static_cast<size_t>(mesh.pp_rank())],
                              mesh.pp_rank(), n, torch::kCPU);
  // What PipelineStep does: the replicas' sum started by each stage's last backward (small
  // buckets: several), finished after the schedule, then the tied weight's halves.
  std::vector<std::unique_ptr<parallel::ReplicaGradSync>> replica_sum;
  for (auto& model : models) {
    replica_sum.push_back(
        std::make_unique<parallel::ReplicaGradSync>(model->parameters(), replicas, 0.01));
  }
  for (size_t c = 0; c < stages.size(); ++c) {
    stages[c]->set_last_backward_hook([sum = replica_sum[c].get()] { sum->begin_backward(true); });
  }
  executor.run_step(0, 0.0);
  for (auto& sum : replica_sum) sum->end_backward();
  parallel::sync_tied_gradient(models, pipe);

  // The loss: the last stage's, broadcast in the pipeline, summed over the replicas.
  double sum = 0;
  for (auto& s : stages) sum += s->take_loss();
  auto t = torch::tensor({sum}, torch::kFloat64);
  if (n > 1) pipe.broadcast(t, n - 1);
  replicas.all_reduce(t, comm::ReduceOp::kSum);
  EXPECT_NEAR(t.item<double>(), ref_loss, 1e-5 * ref_loss);

  int checked = 0;
  for (const auto& model : models) {
    for (const auto& p : model->named_parameters()) {
      ASSERT_TRUE(p.value().grad().defined()) << p.key();
      EXPECT_LT(rel_diff(p.value().grad(), ref_grad.at(p.key())), 1e-5) << p.key();
      ++checked;
    }
  }
  EXPECT_GT(checked, 0);

  // One AdamW step: the same parameters as the whole model's, and the same bits in every replica.
  // Adam's first step moves each element by about lr * g / (|g| + eps), so an element whose
  // gradient is tiny moves by a fraction of lr set by that gradient's last bits: differences are
  // measured against the model's parameter scale (its largest parameter, the LayerNorm gains'
  // 1), not against each tensor's own (a bias that started at zero is lr-sized).
  double scale = 0;
  for (const auto& p : ref_param) scale = std::max(scale, p.second.abs().max().item<double>());
  double checksum = 0;
  for (auto& model : models) {
    compat::FusedAdamW opt(model->parameters(), torch::optim::AdamWOptions(kLr));
    opt.step();
    for (const auto& p : model->named_parameters()) {
      const double diff = (p.value() - ref_param.at(p.key())).abs().max().item<double>();
      EXPECT_LT(diff / scale, 1e-5) << p.key();
      checksum += p.value().to(torch::kFloat64).sum().item<double>();
    }
  }
  const auto all = replicas.all_gather(torch::tensor({checksum}, torch::kFloat64));
  for (int d = 1; d < mesh.dp(); ++d) {
    EXPECT_EQ(all[d].item<double>(), all[0].item<double>()) << "replica " << d << " differs";
  }
}

TEST(HybridMpi, EveryMeshAndScheduleEqualsOneRankOnTheWholeBatch) {
  const int world_size = world().size();
  const Case cases[] = {{"gpipe", pipeline::ScheduleKind::kGPipe, 1, false},
                        {"1f1b", pipeline::ScheduleKind::kOneFOneB, 1, false},
                        {"1f1b-zb", pipeline::ScheduleKind::kOneFOneB, 1, true},
                        {"interleaved", pipeline::ScheduleKind::kInterleaved, 2, false},
                        {"interleaved-zb", pipeline::ScheduleKind::kInterleaved, 2, true}};
  int meshes = 0;
  for (int dp = 2; dp <= world_size; ++dp) {
    if (world_size % dp != 0 || kRows % dp != 0) continue;
    const int pp = world_size / dp;
    for (const auto& k : cases) {
      if (k.per_rank > 1 && pp < 2) continue;  // nothing to interleave with
      if ((kRows / dp) % pp != 0) continue;    // M = P micro-batches of a replica's rows
      expect_hybrid_equals_one_rank(dp, k);
    }
    ++meshes;
  }
  EXPECT_GE(meshes, 1);
}

// pp_train --dp D --zero 1 with D = 2, 3 and 4 replicas of a 2-stage pipeline: the first and the
// last stage keep bitwise-equal copies of the tied weight (their shards are summed after the
// replicas' reduce-scatters, and every rank clips by the same factor), and the losses equal the
// unsharded hybrid's.
class HybridZero : public gpt2p::testing::TrainerTest {};

TEST_F(HybridZero, TiedCopiesStayIdenticalAndLossesEqualTheUnshardedRun) {
  const int n = comm->size();
  const auto hybrid = [&](const std::string& out, int zero) {
    auto c = config(out, 3, /*blocks=*/4);
    c.pipeline.dp = n / 2;
    c.optim.batch_size = 24;  // 12, 8 or 6 rows per replica
    c.optim.epochs = 3;       // the small dataset holds 2 such batches
    c.pipeline.microbatches = 2;
    c.data_parallel.zero = zero;
    c.data_parallel.bucket_mb = 0.05;
    c.output.save_every = 3;
    return c;
  };
  ASSERT_EQ(parallel::train_pipeline(hybrid("plain", 0), topo), 0);
  ASSERT_EQ(parallel::train_pipeline(hybrid("zero", 1), topo), 0);
  expect_same_losses("plain", "zero", 3);
  const auto first = model::load_model(dir + "/zero/checkpoint/stage0");
  const auto last = model::load_model(dir + "/zero/checkpoint/stage1");
  ASSERT_TRUE(first->has_embedding() && last->has_head() && !last->has_embedding());
  EXPECT_TRUE(torch::equal(first->tied_parameter(), last->tied_parameter()))
      << "the two copies of wte differ by up to "
      << (first->tied_parameter() - last->tied_parameter()).abs().max().item<double>();
}

}  // namespace
}  // namespace gpt2p
