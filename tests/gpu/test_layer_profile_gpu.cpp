// The layer profile on a GPU (pipeline/perf/layer_profile.h), as pp_plan and pp_train
// --partition measured run it: each part timed eagerly and as CUDA graphs, the way a stage runs
// under --cuda-graphs auto. Timings are not compared (no timed tests): the graphed profile must
// run every part through its capture and replays, give finite positive times, and count the same
// activation bytes as the eager one (both measure them eagerly, before any graph).
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <cmath>

#include "gpt2p/model/config.h"
#include "gpt2p/model/options.h"
#include "gpt2p/pipeline/perf/layer_profile.h"
#include "gpt2p/pipeline/perf/planner.h"

namespace gpt2p::pipeline {
namespace {

const c10::Device kGpu(c10::kCUDA, 0);

model::GPT2Config small_model() {
  auto config = model::preset("tiny");
  config.n_layer = 4;
  config.dropout = 0.0;
  return config;
}

TEST(LayerProfileGpu, GraphedPartsRunAndKeepTheEagerBytes) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  const auto config = small_model();
  for (const auto kernels : {model::Kernels::kReference, model::Kernels::kFused}) {
    SCOPED_TRACE(name_string(kernels));
    const auto time = [&](bool graphs) {
      LayerTiming timing;
      timing.warmup = 1;
      timing.reps = 3;
      timing.rounds = 2;
      timing.kernels = kernels;
      timing.graphs = graphs;
      return measure_layer_times(config, /*micro_rows=*/2, /*seq_len=*/64, torch::kBFloat16, kGpu,
                                 timing);
    };
    const LayerTimes eager = time(false), graphed = time(true);
    for (const LayerTimes& t : {eager, graphed}) {
      for (double s : {t.embedding, t.block, t.head, t.stage}) {
        EXPECT_TRUE(std::isfinite(s));
        EXPECT_GE(s, 0.0);
        EXPECT_LT(s, 1.0);  // seconds: a stuck or runaway loop
      }
      EXPECT_GT(t.block, 0.0);
      EXPECT_GT(t.head, 0.0);
      EXPECT_TRUE(t.activations.measured);
    }
    EXPECT_EQ(graphed.activations.block, eager.activations.block);
    EXPECT_EQ(graphed.activations.head, eager.activations.head);
    EXPECT_EQ(graphed.activations.embedding, eager.activations.embedding);
    EXPECT_EQ(graphed.activations.block_recompute, eager.activations.block_recompute);
  }
}

// make_plan on the GPU times as CUDA graphs when pp_train would run the plan so, and says so.
TEST(LayerProfileGpu, APlanOnTheGpuIsTimedAsGraphs) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  PlanSpec spec;
  spec.stages = 2;
  spec.batch_size = 4;
  spec.seq_len = 32;
  spec.precision = model::Precision::kBf16;
  spec.microbatches = {2};
  spec.stages_per_rank = {1};
  spec.reps = 2;
  spec.loss_fraction = 1.0;
  const Plan graphed = make_plan(small_model(), spec, kGpu);
  EXPECT_EQ(graphed.eager_because, "");
  EXPECT_FALSE(graphed.rows.empty());
  spec.cuda_graphs = false;
  EXPECT_EQ(make_plan(small_model(), spec, kGpu).eager_because, "--cuda-graphs off");
}

}  // namespace
}  // namespace gpt2p::pipeline
