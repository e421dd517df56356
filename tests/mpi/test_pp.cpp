// Pipeline correctness on 2, 3 and 4 ranks: the loss and every parameter's gradient equal one
// rank's run of the whole model on the same batch, for GPipe and 1F1B (one stage per rank) and the
// interleaved schedule (2 and 3 stages per rank), every partition and several micro-batch counts;
// short training curves agree with model parallelism and with the whole model.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "gpt2p/comm/communicator.h"
#include "gpt2p/compat/rng.h"
#include "gpt2p/core/error.h"
#include "gpt2p/parallel/data_parallel/replica_grad_sync.h"
#include "gpt2p/parallel/train/context.h"
#include "gpt2p/parallel/trainers/pp_trainer.h"
#include "gpt2p/pipeline/plan/zero_bubble.h"
#include "gpt2p/pipeline/runtime/executor.h"
#include "support/small_model.h"

namespace gpt2p {
namespace {

constexpr int64_t kBatch = 8, kSeq = 8;
constexpr uint64_t kSeed = 1234;

comm::Communicator& world() {
  static auto comm = comm::make_mpi_communicator();
  return *comm;
}

// The pipeline's gradient channel (pp_train uses a second communicator too).
comm::Communicator& grad_comm() {
  static auto comm = comm::make_mpi_communicator();
  return *comm;
}

// The tiny preset with 4 blocks (4 stages fit), no dropout, a small vocabulary (fast head).
model::GPT2Config small_config() { return gpt2p::testing::small_model(4, 500); }

// The same random batch on every rank (seeded generator).
pipeline::StageBatch random_batch(uint64_t seed, int64_t vocab, int64_t rows = kBatch) {
  auto gen = compat::make_cpu_generator(seed);
  pipeline::StageBatch b;
  b.inputs = torch::randint(vocab, {rows, kSeq}, gen, torch::kInt64);
  b.labels = torch::randint(vocab, {rows, kSeq}, gen, torch::kInt64);
  b.mask = (torch::rand({rows, kSeq}, gen) > 0.3).to(torch::kFloat32);
  b.mask[0][0] = 1.0f;
  b.global_target_tokens = static_cast<int64_t>(b.mask.sum().item<double>());
  return b;
}

// Max |a - b| relative to max |b| (with a floor for all-zero gradients).
double rel_diff(const torch::Tensor& a, const torch::Tensor& b) {
  const double scale = std::max(b.abs().max().item<double>(), 1e-8);
  return (a - b).abs().max().item<double>() / scale;
}

// This rank's stages (rank + c * ranks) of one pipeline.
struct PipelineRun {
  std::vector<model::GPT2> models;
  std::vector<std::unique_ptr<pipeline::GptStage>> stages;
  std::unique_ptr<pipeline::CommTransport> transport;
  std::unique_ptr<pipeline::Executor> executor;

  void set_batch(const pipeline::StageBatch& b) {
    for (auto& s : stages) s->set_batch(b);
  }
  std::vector<torch::Tensor> parameters() const {
    std::vector<torch::Tensor> out;
    for (const auto& m : models) {
      for (const auto& p : m->parameters()) out.push_back(p);
    }
    return out;
  }
};

// zero_bubble: split backwards, W's placed by zero_bubble_schedule (schedule.h). lookup_per_step:
// the first stage sums the token lookup's gradient once per step
// (GptStage::sum_lookup_grads_per_step, as pp_train without replicas).
PipelineRun make_pipeline(const model::GPT2Config& config, const std::string& partition,
                          pipeline::ScheduleKind kind, int m, int per_rank = 1,
                          int64_t rows = kBatch, bool zero_bubble = false,
                          bool lookup_per_step = true) {
  auto& comm = world();
  const int n = comm.size();
  std::vector<double> costs;
  if (partition == "measured") {
    costs = parallel::measured_layer_costs(comm, config, rows / m, kSeq, torch::kFloat32);
  }
  const auto split = parallel::stage_partition(*from_name<pipeline::PartitionKind>(partition),
                                               config, n * per_rank, kSeq, costs, per_rank);
  PipelineRun run;
  std::vector<pipeline::Stage*> stages;
  for (int c = 0; c < per_rank; ++c) {
    const auto r = split[static_cast<size_t>(comm.rank() + c * n)];
    run.models.emplace_back(config, r);
    run.models.back()->reset_parameters(kSeed);
    run.stages.push_back(std::make_unique<pipeline::GptStage>(
        run.models.back(), m, torch::kFloat32, model::LossPositions::kTargets, zero_bubble));
    if (lookup_per_step) run.stages.back()->sum_lookup_grads_per_step();
    stages.push_back(run.stages.back().get());
  }
  // MPI calls never block, so the wrap channels may share the two communicators.
  run.transport = std::make_unique<pipeline::CommTransport>(comm, grad_comm(), &comm, &grad_comm());
  const auto schedule =
      zero_bubble
          ? pipeline::make_zero_bubble_schedule(
                kind, m, n, per_rank,
                pipeline::zero_bubble_costs(split, static_cast<int>(config.n_layer),
                                            static_cast<int>(config.n_embd), kSeq,
                                            static_cast<int>(config.padded_vocab_size()), 1))
          : pipeline::make_schedule(kind, m, n, per_rank);
  run.executor = std::make_unique<pipeline::Executor>(stages, *run.transport,
                                                      schedule[static_cast<size_t>(comm.rank())],
                                                      comm.rank(), n, torch::kCPU);
  return run;
}

double pipeline_loss(PipelineRun& run);

// One step of `run` on `batch`: the loss and every gradient of this rank's stages equal the whole
// model's (`ref`), the tied weight's on both ends included.
void expect_whole_model_gradients(PipelineRun& run, const pipeline::StageBatch& batch,
                                  double ref_loss, std::map<std::string, torch::Tensor>& ref) {
  run.set_batch(batch);
  run.executor->run_step(0, 0.0);
  parallel::sync_tied_gradient(run.models, world());
  EXPECT_NEAR(pipeline_loss(run), ref_loss, 1e-5 * ref_loss);
  int checked = 0;
  for (const auto& model : run.models) {
    for (const auto& p : model->named_parameters()) {
      ASSERT_TRUE(ref.count(p.key())) << p.key();
      ASSERT_TRUE(p.value().grad().defined()) << p.key();
      EXPECT_LT(rel_diff(p.value().grad(), ref[p.key()]), 1e-5) << p.key();
      ++checked;
    }
    // The tied weight: embedding part + head part on both the first and the last stage.
    if (model->tied_parameter().defined()) {
      EXPECT_LT(rel_diff(model->tied_parameter().grad(), ref["wte.weight"]), 1e-5);
    }
  }
  EXPECT_GT(checked, 0);
}

// Loss of the whole batch on the whole model; gradients left in `full`.
double full_step(model::GPT2& full, const pipeline::StageBatch& b) {
  auto loss = parallel::scaled_loss(full->forward(b.inputs), b.labels, b.mask,
                                    full->config().vocab_size, b.global_target_tokens, 1);
  loss.backward();
  return loss.item<double>();
}

// One step of the whole model on `batch`: its loss and every parameter's gradient, by name.
std::pair<double, std::map<std::string, torch::Tensor>> whole_model_reference(
    const model::GPT2Config& config, const pipeline::StageBatch& batch) {
  model::GPT2 full(config);
  full->reset_parameters(kSeed);
  const double loss = full_step(full, batch);
  std::map<std::string, torch::Tensor> grads;
  for (const auto& p : full->named_parameters()) grads[p.key()] = p.value().grad();
  return {loss, grads};
}

// The loss as every rank sees it: broadcast from the last stage.
double pipeline_loss(PipelineRun& run) {
  double sum = 0;
  for (auto& s : run.stages) sum += s->take_loss();
  auto t = torch::tensor({sum}, torch::kFloat64);
  world().broadcast(t, world().size() - 1);
  return t.item<double>();
}

TEST(PipelineMpi, LossAndEveryGradientMatchTheWholeModel) {
  const auto config = small_config();
  const auto batch = random_batch(7, config.vocab_size);
  auto [ref_loss, ref] = whole_model_reference(config, batch);

  for (const std::string partition : {"uniform", "balanced", "measured"}) {
    for (auto kind : {pipeline::ScheduleKind::kGPipe, pipeline::ScheduleKind::kOneFOneB}) {
      for (int m : {1, 2, 4}) {
        for (const bool per_step : {true, false}) {
          SCOPED_TRACE(partition + " " + pipeline::to_string(kind) + " M=" + std::to_string(m) +
                       (per_step ? " lookup per step" : " lookup per micro-batch"));
          auto run = make_pipeline(config, partition, kind, m, 1, kBatch, false, per_step);
          expect_whole_model_gradients(run, batch, ref_loss, ref);
        }
      }
    }
  }
}

// Interleaved: 2 and 3 stages per rank, on a model with enough blocks for 4 ranks x 3 stages.
TEST(PipelineMpi, InterleavedLossAndEveryGradientMatchTheWholeModel) {
  auto config = small_config();
  config.n_layer = 12;
  const int n = world().size();
  constexpr int64_t kRows = 12;  // divisible by M = 2, 3, 4, 6
  const auto batch = random_batch(9, config.vocab_size, kRows);
  auto [ref_loss, ref] = whole_model_reference(config, batch);

  int runs = 0;
  for (const std::string partition : {"uniform", "balanced", "measured"}) {
    for (int per_rank : {2, 3}) {
      for (int m : {n, 2 * n}) {
        // HW5's uniform split exists only where the stages divide the 12 blocks evenly enough.
        if (kRows % m != 0 || (partition == "uniform" && 12 % (n * per_rank) != 0)) continue;
        SCOPED_TRACE(partition + " interleaved x" + std::to_string(per_rank) +
                     " M=" + std::to_string(m));
        auto run = make_pipeline(config, partition, pipeline::ScheduleKind::kInterleaved, m,
                                 per_rank, kRows);
        expect_whole_model_gradients(run, batch, ref_loss, ref);
        ++runs;
      }
    }
  }
  EXPECT_GE(runs, 5);
}

// Zero bubble: every backward split into B and W, the W's moved into the bubbles; the sums must
// not change (1F1B, GPipe and interleaved bases).
TEST(PipelineMpi, ZeroBubbleLossAndEveryGradientMatchTheWholeModel) {
  auto config = small_config();
  config.n_layer = 12;
  const int n = world().size();
  constexpr int64_t kRows = 12;
  const auto batch = random_batch(11, config.vocab_size, kRows);
  auto [ref_loss, ref] = whole_model_reference(config, batch);

  for (auto kind : {pipeline::ScheduleKind::kOneFOneB, pipeline::ScheduleKind::kGPipe}) {
    for (int m : {1, 2, 4}) {
      SCOPED_TRACE("zero-bubble " + pipeline::to_string(kind) + " M=" + std::to_string(m));
      auto run = make_pipeline(config, "balanced", kind, m, 1, kRows, true);
      expect_whole_model_gradients(run, batch, ref_loss, ref);
    }
  }
  for (int m : {n, 2 * n}) {
    if (kRows % m != 0) continue;
    SCOPED_TRACE("zero-bubble interleaved x2 M=" + std::to_string(m));
    auto run =
        make_pipeline(config, "balanced", pipeline::ScheduleKind::kInterleaved, m, 2, kRows, true);
    expect_whole_model_gradients(run, batch, ref_loss, ref);
  }
}

TEST(PipelineMpi, TrainingCurvesMatchModelParallelAndTheWholeModel) {
  const auto config = small_config();
  const double lr = 1e-3, clip = 1.0;
  model::GPT2 full(config);
  full->reset_parameters(kSeed);
  torch::optim::AdamW full_opt(full->parameters(),
                               torch::optim::AdamWOptions(lr).weight_decay(0.01));
  auto pp = make_pipeline(config, "balanced", pipeline::ScheduleKind::kOneFOneB, 4);
  auto mp = make_pipeline(config, "balanced", pipeline::ScheduleKind::kGPipe, 1);  // model_parallel
  torch::optim::AdamW pp_opt(pp.parameters(), torch::optim::AdamWOptions(lr).weight_decay(0.01));
  torch::optim::AdamW mp_opt(mp.parameters(), torch::optim::AdamWOptions(lr).weight_decay(0.01));
  auto step = [&](PipelineRun& run, torch::optim::AdamW& opt, const pipeline::StageBatch& b) {
    run.set_batch(b);
    run.executor->run_step(0, 0.0);
    parallel::sync_tied_gradient(run.models, world());
    parallel::clip_grad_norm_pipeline(run.models, &world(), clip);
    opt.step();
    opt.zero_grad();
    return pipeline_loss(run);
  };
  for (int s = 0; s < 3; ++s) {
    const auto b = random_batch(100 + s, config.vocab_size);
    const double ref = full_step(full, b);
    torch::nn::utils::clip_grad_norm_(full->parameters(), clip);
    full_opt.step();
    full_opt.zero_grad();
    const double l_pp = step(pp, pp_opt, b);
    const double l_mp = step(mp, mp_opt, b);
    EXPECT_NEAR(l_pp, ref, 1e-5 * ref) << "step " << s;
    EXPECT_NEAR(l_mp, ref, 1e-5 * ref) << "step " << s;
    EXPECT_NEAR(l_pp, l_mp, 1e-5 * ref) << "step " << s;
  }
  // The two copies of the tied weight stayed identical through the optimizer steps.
  auto w = pp.models[0]->tied_parameter();
  if (w.defined()) {
    auto other = w.detach().clone();
    const int n = world().size(), peer = pp.models[0]->has_embedding() ? n - 1 : 0;
    if (world().rank() < peer) {
      world().send(w.detach(), peer);
      world().recv(other, peer);
    } else {
      world().recv(other, peer);
      world().send(w.detach(), peer);
    }
    EXPECT_TRUE(torch::equal(w.detach(), other));
  }
}

// Rank 0 measures, every rank cuts with rank 0's numbers: the same positive costs everywhere.
TEST(PipelineMpi, MeasuredCostsAreRankZerosOnEveryRank) {
  const auto config = small_config();
  const auto costs = parallel::measured_layer_costs(world(), config, 2, kSeq, torch::kFloat32);
  ASSERT_EQ(costs.size(), static_cast<size_t>(config.n_layer) + 2);
  // The embedding may cost no more than a stage call (0 beyond it); blocks and the head cost more.
  EXPECT_GE(costs.front(), 0.0);
  for (size_t i = 1; i < costs.size(); ++i) EXPECT_GT(costs[i], 0.0) << "layer " << i;
  auto mine = torch::tensor(costs, torch::kFloat64);
  auto rank0 = mine.clone();
  world().broadcast(rank0, 0);
  EXPECT_TRUE(torch::equal(rank0, mine));
  const auto split = parallel::stage_partition(pipeline::PartitionKind::kMeasured, config,
                                               world().size(), kSeq, costs);
  EXPECT_EQ(split.size(), static_cast<size_t>(world().size()));
}

TEST(PipelineMpi, ErrorsNameTheProblem) {
  const auto config = small_config();  // 4 blocks
  try {
    parallel::stage_partition(pipeline::PartitionKind::kUniform, config, 5, kSeq);
    ADD_FAILURE() << "5 stages for 4 blocks should fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("n_stages = 5 is more than the model's n_blocks = 4"),
              std::string::npos)
        << e.what();
  }
  model::GPT2 m(config);
  pipeline::GptStage stage(m, 3, torch::kFloat32);
  try {
    stage.set_batch(random_batch(1, config.vocab_size));
    ADD_FAILURE() << "8 rows into 3 micro-batches should fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("batch of 8 rows does not split into 3 micro-batches"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace gpt2p
