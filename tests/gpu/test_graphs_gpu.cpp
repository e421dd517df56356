// CUDA graphs (--cuda-graphs): the whole-step mechanism on a small body (new inputs reach the
// replayed graph, other shapes run eagerly); dp_train's loop on one rank, and pp_train's stages
// (one graph pair per micro-batch, pipeline/runtime/stage_graphs.h) on every rank of the job
// (ranks sharing the GPU talk over NCCL), each graphed against the same run launched kernel by
// kernel, whose losses must agree step by step.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <cmath>
#include <string>

#include "gpt2p/parallel/train/graphed_step.h"
#include "gpt2p/parallel/trainers/dp_trainer.h"
#include "gpt2p/parallel/trainers/pp_trainer.h"
#include "gpt2p/pipeline/runtime/stage_graphs.h"
#include "support/h5_read.h"
#include "support/trainer_fixture.h"

namespace gpt2p::parallel {
namespace {

using gpt2p::testing::read_column;

TEST(GraphedStepGpu, ReplaysSeeNewInputsAndOtherShapesRunEagerly) {
  if (torch::cuda::device_count() < 1) GTEST_SKIP() << "needs a GPU";
  const torch::Device dev(torch::kCUDA, 0);
  GraphedStep graph(dev, "", /*announce=*/false);
  ASSERT_TRUE(graph.enabled()) << graph.describe();
  // The body reads its input and updates state that lives outside the graph, as an optimizer
  // does: every step, eager or replayed, must add its input's sum to `total` exactly once.
  auto total = torch::zeros({}, torch::TensorOptions().device(dev).dtype(torch::kFloat64));
  int host_calls = 0, replayed = 0;
  const auto body = [&](const GraphedStep::Tensors& in) -> GraphedStep::Tensors {
    ++host_calls;
    const auto sum = (in[0].to(torch::kFloat64) * 2).sum();
    total.add_(sum);
    return {sum};
  };
  double expected = 0;
  for (int step = 0; step < 6; ++step) {
    const int64_t n = step == 4 ? 5 : 7;  // step 4: another shape, run eagerly
    const auto x = torch::arange(n, torch::TensorOptions().device(dev)).to(torch::kFloat32) + step;
    const auto out = graph.run(
        {x}, body, [] { return true; }, [&] { ++replayed; });
    const double want = 2 * (x.sum().item<double>());
    expected += want;
    EXPECT_DOUBLE_EQ(out[0].item<double>(), want) << "step " << step;
  }
  torch::cuda::synchronize();
  EXPECT_DOUBLE_EQ(total.item<double>(), expected);
  // Steps 0, 1 warm up, 2 is captured (and runs by its first replay), 3 and 5 replay, 4 is eager.
  EXPECT_EQ(graph.replays(), 3);
  EXPECT_EQ(graph.eager_after_capture(), 1);
  EXPECT_EQ(replayed, 2) << "after_replay runs for the replays after the capture's own";
  EXPECT_EQ(host_calls, 4) << "warm-up 2, capture 1, eager 1: replays skip the host";
}

TEST(GraphedStepGpu, OffWhenBlockedOrNotAGpu) {
  GraphedStep blocked(torch::Device(torch::kCUDA, 0), "--cuda-graphs off", false);
  EXPECT_FALSE(blocked.enabled());
  EXPECT_EQ(blocked.describe(), "off (--cuda-graphs off)");
  GraphedStep cpu(torch::Device(torch::kCPU), "", false);
  EXPECT_FALSE(cpu.enabled());
}

class GraphedTraining : public gpt2p::testing::TrainerTest {
 protected:
  void SetUp() override {
    if (torch::cuda::device_count() < 1) GTEST_SKIP() << "needs a GPU";
    TrainerTest::SetUp();
  }
  // The fixture's small model on the GPU with every position in the loss (fixed head rows).
  TrainConfig on_gpu(const std::string& out, model::Precision precision, int grad_accum,
                     CudaGraphs graphs) const {
    auto c = config(out, kSteps);
    c.compute.device = DeviceKind::kCuda;
    c.compute.precision = precision;
    c.compute.loss_positions = model::LossPositions::kAll;
    c.compute.cuda_graphs = graphs;
    c.optim.grad_accum = grad_accum;
    c.output.save_every = -1;
    return c;
  }
  double attribute(const std::string& out, const std::string& name) const {
    return gpt2p::testing::read_attribute(rank_file(out), name);
  }
  static constexpr int64_t kSteps = 5;
};

TEST_F(GraphedTraining, DataParallelLossesEqualTheEagerRun) {
  if (comm->size() != 1) GTEST_SKIP() << "graphs capture one rank's step";
  struct Case {
    model::Precision precision;
    int grad_accum;
  };
  for (const Case k : {Case{model::Precision::kBf16, 1}, Case{model::Precision::kBf16, 2},
                       Case{model::Precision::kFp32, 1}}) {
    const std::string name =
        std::string(name_of(k.precision)) + "-ga" + std::to_string(k.grad_accum);
    SCOPED_TRACE(name);
    ASSERT_EQ(
        train_data_parallel(on_gpu(name + "-graphed", k.precision, k.grad_accum, CudaGraphs::kAuto),
                            Program::kDataParallel, topo),
        0);
    ASSERT_EQ(
        train_data_parallel(on_gpu(name + "-eager", k.precision, k.grad_accum, CudaGraphs::kOff),
                            Program::kDataParallel, topo),
        0);
    EXPECT_EQ(attribute(name + "-graphed", "cuda_graph_replays"),
              kSteps - GraphedStep::kWarmupSteps);
    EXPECT_EQ(attribute(name + "-eager", "cuda_graph_replays"), 0);
    // The replays launch the eager step's kernels on the same data: equal up to the rounding of
    // a library that picks another algorithm inside a capture.
    expect_same_losses(name + "-graphed", name + "-eager", kSteps);
  }
}

// A checkpoint written after graphed steps holds what the replays did on the host's side too
// (AdamW's step counts): a run resumed from it continues the graphed run that never stopped, one
// epoch later, after an evaluation between the replays.
TEST_F(GraphedTraining, ResumeAfterGraphedStepsContinuesTheRun) {
  if (comm->size() != 1) GTEST_SKIP() << "graphs capture one rank's step";
  const auto run = [&](const std::string& out, int64_t steps) {
    auto c = on_gpu(out, model::Precision::kBf16, 1, CudaGraphs::kAuto);
    c.optim.epochs = 2;
    c.optim.max_steps = steps;
    return c;
  };
  ASSERT_EQ(train_data_parallel(run("whole", kSteps + 1), Program::kDataParallel, topo), 0);
  auto head = run("head", kSteps);
  head.output.save_every = kSteps;
  ASSERT_EQ(train_data_parallel(head, Program::kDataParallel, topo), 0);
  auto tail = run("tail", kSteps + 1);
  tail.output.resume = dir + "/head/checkpoint";
  ASSERT_EQ(train_data_parallel(tail, Program::kDataParallel, topo), 0);
  EXPECT_EQ(attribute("head", "cuda_graph_replays"), kSteps - GraphedStep::kWarmupSteps);
  EXPECT_EQ(attribute("whole", "cuda_graph_replays"), kSteps + 1 - GraphedStep::kWarmupSteps);
  const auto whole = read_column(rank_file("whole"), "/steps/loss");
  const auto rest = read_column(rank_file("tail"), "/steps/loss");
  ASSERT_EQ(whole.size(), static_cast<size_t>(kSteps + 1));
  ASSERT_EQ(rest.size(), 1U);
  EXPECT_NEAR(rest[0], whole.back(), 1e-5 * whole.back())
      << "the resumed step must see the parameters and AdamW state the graphed steps left";
}

// Every schedule the stages graph: GPipe and 1F1B (one stage per rank) and, on 2 ranks,
// interleaved (two stages per rank, whose graphs share the rank's pool), at M = 4.
TEST_F(GraphedTraining, PipelineLossesEqualTheEagerRun) {
  struct Case {
    const char* schedule;
    int stages_per_rank;
  };
  for (const Case k : {Case{"gpipe", 1}, Case{"1f1b", 1}, Case{"interleaved", 2}}) {
    if (k.stages_per_rank > 1 && comm->size() < 2) continue;  // pp_train refuses it on 1 rank
    SCOPED_TRACE(k.schedule);
    const std::string name = std::string("pp-") + k.schedule;
    for (const auto graphs : {CudaGraphs::kAuto, CudaGraphs::kOff}) {
      auto c = on_gpu(name + (graphs == CudaGraphs::kAuto ? "-graphed" : "-eager"),
                      model::Precision::kBf16, 1, graphs);
      c.model.n_layer = 4;
      c.pipeline.mode = PipelineMode::kPipeline;
      c.pipeline.schedule = *from_name<pipeline::ScheduleKind>(k.schedule);
      c.pipeline.microbatches = 4;
      c.pipeline.stages_per_rank = k.stages_per_rank;
      ASSERT_EQ(train_pipeline(c, topo), 0);
    }
    EXPECT_EQ(attribute(name + "-graphed", "cuda_graph_replays"),
              kSteps - pipeline::StageGraphs::kWarmupSteps);
    EXPECT_EQ(attribute(name + "-eager", "cuda_graph_replays"), 0);
    expect_same_losses(name + "-graphed", name + "-eager", kSteps);
  }
}

TEST_F(GraphedTraining, TargetPositionsRunEagerly) {
  if (comm->size() != 1) GTEST_SKIP() << "graphs capture one rank's step";
  auto c = on_gpu("targets", model::Precision::kBf16, 1, CudaGraphs::kAuto);
  c.compute.loss_positions = model::LossPositions::kTargets;
  ASSERT_EQ(train_data_parallel(c, Program::kDataParallel, topo), 0);
  EXPECT_EQ(attribute("targets", "cuda_graph_replays"), 0);
  c.output.out += "-pp";
  c.pipeline.mode = PipelineMode::kPipeline;
  c.pipeline.microbatches = 4;
  ASSERT_EQ(train_pipeline(c, topo), 0);
  EXPECT_EQ(attribute("targets-pp", "cuda_graph_replays"), 0);
}

}  // namespace
}  // namespace gpt2p::parallel
