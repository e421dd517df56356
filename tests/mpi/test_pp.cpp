// Pipeline correctness on 2, 3 and 4 ranks (one stage each): the loss and every parameter's
// gradient equal one rank's run of the whole model on the same batch, for GPipe and 1F1B, both
// partitions and several micro-batch counts; short training curves agree with model parallelism
// and with the whole model.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "gpt2p/comm/communicator.h"
#include "gpt2p/core/error.h"
#include "gpt2p/parallel/pp_trainer.h"
#include "gpt2p/parallel/run_context.h"
#include "gpt2p/pipeline/executor.h"

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
model::GPT2Config small_config() {
  auto c = model::preset("tiny");
  c.n_layer = 4;
  c.dropout = 0.0;
  c.vocab_size = 500;
  return c;
}

// The same random batch on every rank (seeded generator).
pipeline::StageBatch random_batch(uint64_t seed, int64_t vocab) {
  auto gen = compat::make_cpu_generator(seed);
  pipeline::StageBatch b;
  b.inputs = torch::randint(vocab, {kBatch, kSeq}, gen, torch::kInt64);
  b.labels = torch::randint(vocab, {kBatch, kSeq}, gen, torch::kInt64);
  b.mask = (torch::rand({kBatch, kSeq}, gen) > 0.3).to(torch::kFloat32);
  b.mask[0][0] = 1.0f;
  b.global_target_tokens = static_cast<int64_t>(b.mask.sum().item<double>());
  return b;
}

// Max |a - b| relative to max |b| (with a floor for all-zero gradients).
double rel_diff(const torch::Tensor& a, const torch::Tensor& b) {
  const double scale = std::max(b.abs().max().item<double>(), 1e-8);
  return (a - b).abs().max().item<double>() / scale;
}

struct PipelineRun {
  model::GPT2 model{nullptr};
  std::unique_ptr<pipeline::GptStage> stage;
  std::unique_ptr<pipeline::CommTransport> transport;
  std::unique_ptr<pipeline::Executor> executor;
};

PipelineRun make_pipeline(const model::GPT2Config& config, const std::string& partition,
                          pipeline::ScheduleKind kind, int m) {
  auto& comm = world();
  std::vector<double> costs;
  if (partition == "measured") {
    costs = parallel::measured_layer_costs(comm, config, kBatch / m, kSeq, /*bf16=*/false);
  }
  const auto split = parallel::stage_partition(partition, config, comm.size(), kSeq, costs);
  const auto r = split[static_cast<size_t>(comm.rank())];
  PipelineRun run;
  run.model = model::GPT2(config, model::LayerRange{r.begin, r.end});
  run.model->reset_parameters(kSeed);
  run.stage = std::make_unique<pipeline::GptStage>(run.model, m, /*bf16=*/false);
  run.transport = std::make_unique<pipeline::CommTransport>(comm, grad_comm());
  run.executor = std::make_unique<pipeline::Executor>(
      *run.stage, *run.transport,
      pipeline::make_schedule(kind, m, comm.size())[static_cast<size_t>(comm.rank())], comm.rank(),
      torch::kCPU);
  return run;
}

// Loss of the whole batch on the whole model; gradients left in `full`.
double full_step(model::GPT2& full, const pipeline::StageBatch& b) {
  auto loss = parallel::scaled_loss(full->forward(b.inputs), b.labels, b.mask,
                                    full->config().vocab_size, b.global_target_tokens, 1);
  loss.backward();
  return loss.item<double>();
}

// The loss as every rank sees it: broadcast from the last stage.
double pipeline_loss(pipeline::GptStage& stage) {
  auto t = torch::tensor({stage.take_loss()}, torch::kFloat64);
  world().broadcast(t, world().size() - 1);
  return t.item<double>();
}

TEST(PipelineMpi, LossAndEveryGradientMatchTheWholeModel) {
  const auto config = small_config();
  const auto batch = random_batch(7, config.vocab_size);
  model::GPT2 full(config);
  full->reset_parameters(kSeed);
  const double ref_loss = full_step(full, batch);
  std::map<std::string, torch::Tensor> ref;
  for (const auto& p : full->named_parameters()) ref[p.key()] = p.value().grad();

  for (const std::string partition : {"uniform", "balanced", "measured"}) {
    for (auto kind : {pipeline::ScheduleKind::kGPipe, pipeline::ScheduleKind::kOneFOneB}) {
      for (int m : {1, 2, 4}) {
        SCOPED_TRACE(partition + " " + pipeline::to_string(kind) + " M=" + std::to_string(m));
        auto run = make_pipeline(config, partition, kind, m);
        run.stage->set_batch(batch);
        run.executor->run_step(0, 0.0);
        pipeline::sync_tied_gradient(*run.model, world());
        EXPECT_NEAR(pipeline_loss(*run.stage), ref_loss, 1e-5 * ref_loss);
        int checked = 0;
        for (const auto& p : run.model->named_parameters()) {
          ASSERT_TRUE(ref.count(p.key())) << p.key();
          ASSERT_TRUE(p.value().grad().defined()) << p.key();
          EXPECT_LT(rel_diff(p.value().grad(), ref[p.key()]), 1e-5) << p.key();
          ++checked;
        }
        EXPECT_GT(checked, 0);
        // The tied weight: embedding part + head part on both the first and the last stage.
        if (run.model->tied_parameter().defined()) {
          EXPECT_LT(rel_diff(run.model->tied_parameter().grad(), ref["wte.weight"]), 1e-5);
        }
      }
    }
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
  torch::optim::AdamW pp_opt(pp.model->parameters(),
                             torch::optim::AdamWOptions(lr).weight_decay(0.01));
  torch::optim::AdamW mp_opt(mp.model->parameters(),
                             torch::optim::AdamWOptions(lr).weight_decay(0.01));
  auto step = [&](PipelineRun& run, torch::optim::AdamW& opt, const pipeline::StageBatch& b) {
    run.stage->set_batch(b);
    run.executor->run_step(0, 0.0);
    pipeline::sync_tied_gradient(*run.model, world());
    pipeline::clip_grad_norm_pipeline(*run.model, &world(), clip);
    opt.step();
    opt.zero_grad();
    return pipeline_loss(*run.stage);
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
  auto w = pp.model->tied_parameter();
  if (w.defined()) {
    auto other = w.detach().clone();
    const int n = world().size(), peer = pp.model->has_embedding() ? n - 1 : 0;
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
  const auto costs = parallel::measured_layer_costs(world(), config, 2, kSeq, /*bf16=*/false);
  ASSERT_EQ(costs.size(), static_cast<size_t>(config.n_layer) + 2);
  for (size_t i = 0; i < costs.size(); ++i) EXPECT_GT(costs[i], 0.0) << "layer " << i;
  auto mine = torch::tensor(costs, torch::kFloat64);
  auto rank0 = mine.clone();
  world().broadcast(rank0, 0);
  EXPECT_TRUE(torch::equal(rank0, mine));
  const auto split = parallel::stage_partition("measured", config, world().size(), kSeq, costs);
  EXPECT_EQ(split.size(), static_cast<size_t>(world().size()));
}

TEST(PipelineMpi, ErrorsNameTheProblem) {
  const auto config = small_config();  // 4 blocks
  try {
    parallel::stage_partition("uniform", config, 5, kSeq);
    ADD_FAILURE() << "5 stages for 4 blocks should fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("n_stages = 5 is more than the model's n_blocks = 4"),
              std::string::npos)
        << e.what();
  }
  model::GPT2 m(config);
  pipeline::GptStage stage(m, 3, false);
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
