// The layer profile behind --partition measured: it times the real stage code on this device and
// turns the times into per-layer costs that the balanced split consumes.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>
#include <vector>

#include "gpt2p/compat/cuda_graph.h"
#include "gpt2p/compat/profiler.h"
#include "gpt2p/core/error.h"
#include "gpt2p/model/config.h"
#include "gpt2p/model/gpt2.h"
#include "gpt2p/parallel/train/graphed_step.h"
#include "gpt2p/parallel/train/options.h"
#include "gpt2p/parallel/trainers/pipeline_step.h"
#include "gpt2p/pipeline/perf/hybrid.h"
#include "gpt2p/pipeline/perf/layer_profile.h"
#include "gpt2p/pipeline/perf/planner.h"
#include "gpt2p/pipeline/plan/partition.h"
#include "gpt2p/pipeline/plan/zero_bubble.h"
#include "support/errors.h"
#include "support/temp_dir.h"

namespace gpt2p::pipeline {
namespace {

using testing::error_of;

// The fewest iterations that still time every part: `warmup` untimed, `rounds` rounds of `reps`.
LayerTiming quick(int warmup = 0, int reps = 1, int rounds = 1) {
  LayerTiming timing;
  timing.warmup = warmup;
  timing.reps = reps;
  timing.rounds = rounds;
  return timing;
}

TEST(LayerProfile, TimesEveryPartOnTheCpu) {
  auto config = model::preset("tiny");
  config.dropout = 0.0;
  const LayerTimes t = measure_layer_times(config, /*micro_rows=*/2, /*seq_len=*/16,
                                           torch::kFloat32, c10::kCPU, quick(1, 2, 2));
  for (double s : {t.embedding, t.block, t.head, t.stage}) {
    EXPECT_TRUE(std::isfinite(s));
    EXPECT_GE(s, 0.0);
    EXPECT_LT(s, 10.0);  // seconds: a stuck or runaway loop, not a slow machine
  }
  EXPECT_GT(t.block, 0.0);
  EXPECT_GT(t.head, 0.0);
  // No allocator statistics on the CPU: the bytes kept are the estimate from the shapes.
  const ActivationBytes estimate = estimate_activation_bytes(config, 2, 16, false, 1.0);
  EXPECT_FALSE(t.activations.measured);
  EXPECT_DOUBLE_EQ(t.activations.block, estimate.block);
  EXPECT_DOUBLE_EQ(t.activations.head, estimate.head);
  EXPECT_LT(t.activations.block_recompute, t.activations.block);
}

// With one block there is no chain to tell the per-stage overhead from the block's own cost.
TEST(LayerProfile, OneBlockLeavesNoStageOverhead) {
  auto config = model::preset("tiny");
  config.n_layer = 1;
  const LayerTimes t = measure_layer_times(config, 1, 8, torch::kFloat32, c10::kCPU, quick());
  EXPECT_EQ(t.stage, 0.0);
  EXPECT_GT(t.block, 0.0);
}

TEST(LayerProfile, Bf16AutocastRunsToo) {
  auto config = model::preset("tiny");
  const LayerTimes t = measure_layer_times(config, 1, 8, torch::kBFloat16, c10::kCPU, quick());
  EXPECT_GT(t.block, 0.0);
  EXPECT_GT(t.head, 0.0);
}

TEST(LayerProfile, CostsFollowThePartitionNumbering) {
  const LayerTimes t{0.5, 2.0, 7.0, 0.0, {}};
  const auto costs = layer_costs_from_times(t, 3);
  ASSERT_EQ(costs.size(), 5u);
  EXPECT_EQ(costs.front(), 0.5);
  for (int i = 1; i <= 3; ++i) EXPECT_EQ(costs[i], 2.0);
  EXPECT_EQ(costs.back(), 7.0);
}

// GPT-2 small on an H200 at 16 x 128: the head costs about 4.2 blocks (FLOPs say 5.3). Measured
// costs move the cut one block later than the FLOP model's 0-9|10-13.
TEST(LayerProfile, AMeasuredHeadMovesTheCut) {
  const auto measured = layer_costs_from_times({0.1, 1.0, 4.2, 0.0, {}}, 12);
  EXPECT_EQ(to_string(partition_balanced(measured, 2)), "0-8|9-13");
  const auto flops = layer_costs_flops(12, 768, 12, 128, 50304);
  EXPECT_EQ(to_string(partition_balanced(flops, 2)), "0-9|10-13");
}

// With the head only at HW5's 9.2% target positions (lm_head_loss.h) it costs half a block, and
// the balanced cut puts 6 blocks on each side: 0-6|7-13.
TEST(LayerProfile, AHeadAtTheTargetPositionsOnlyEvensTheCut) {
  const auto full = layer_costs_flops(12, 768, 12, 128, 50304);
  const auto targets = layer_costs_flops(12, 768, 12, 128, 50304, 0.092);
  EXPECT_DOUBLE_EQ(targets.back(), 0.092 * full.back());
  EXPECT_EQ(targets[1], full[1]);
  EXPECT_EQ(to_string(partition_balanced(targets, 2)), "0-6|7-13");
  EXPECT_NE(
      error_of([] { layer_costs_flops(12, 768, 12, 128, 50304, 0.0); }).find("loss fraction 0"),
      std::string::npos);
}

TEST(LayerProfile, BadArgumentsSayWhatToPass) {
  const auto config = model::preset("tiny");
  EXPECT_NE(error_of([&] {
              measure_layer_times(config, 0, 8, torch::kFloat32, c10::kCPU);
            }).find("micro_rows 0"),
            std::string::npos);
  const auto fails_with = [&](LayerTiming timing) {
    return error_of([&] { measure_layer_times(config, 1, 8, torch::kFloat32, c10::kCPU, timing); });
  };
  LayerTiming timing = quick();
  timing.loss_fraction = 1.5;
  EXPECT_NE(fails_with(timing).find("loss fraction 1.5"), std::string::npos);
  timing = quick();
  timing.reps = 0;
  EXPECT_NE(fails_with(timing).find("reps 0"), std::string::npos);
  timing = quick();
  timing.microbatches = 0;
  EXPECT_NE(fails_with(timing).find("microbatches 0"), std::string::npos);
  timing = quick();
  timing.warmup = -1;
  EXPECT_NE(fails_with(timing).find("warmup -1"), std::string::npos);
  EXPECT_NE(error_of([] { layer_costs_from_times({}, 0); }).find("n_layer 0 < 1"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              measure_step_tail(config, 8, torch::kFloat32, c10::kCPU, model::Kernels::kReference,
                                nullptr);
            }).find("no work to time"),
            std::string::npos);
}

// --loss-positions all: the head runs at every position whatever share of them the loss weights,
// so it keeps what a head over every position keeps.
TEST(LayerProfile, TheHeadAtEveryPositionKeepsEveryRow) {
  const auto config = model::preset("tiny");
  const auto head = [&](double fraction, model::LossPositions positions) {
    LayerTiming timing = quick();
    timing.loss_fraction = fraction;
    timing.positions = positions;
    return measure_layer_times(config, 1, 16, torch::kFloat32, c10::kCPU, timing).activations.head;
  };
  const double every = head(1.0, model::LossPositions::kTargets);
  EXPECT_EQ(head(0.25, model::LossPositions::kAll), every);
  EXPECT_LT(head(0.25, model::LossPositions::kTargets), every);
}

// A part timed as a stage of several micro-batches: each micro-batch's slice of a batch of M
// times the rows runs forward and backward, and the times come out per micro-batch.
TEST(LayerProfile, PartsRunAsAStageOfSeveralMicroBatches) {
  const auto config = model::preset("tiny");
  LayerTiming timing = quick();
  timing.measure_memory = false;
  timing.microbatches = 3;
  const LayerTimes t = measure_layer_times(config, 1, 8, torch::kFloat32, c10::kCPU, timing);
  EXPECT_GT(t.block, 0.0);
  EXPECT_GT(t.head, 0.0);
  EXPECT_GE(t.embedding, 0.0);
}

// The step after the schedule: the runner's closure is made once per part (one block, then a
// chain) and run after every refill of the gradients, which it finds defined.
TEST(LayerProfile, StepTailRunsTheWorkOnEachPart) {
  const auto config = model::preset("tiny");  // 2 blocks: the chain is both
  int made = 0, runs = 0;
  const StepTailRunner runner = [&](model::GPT2& part) -> std::function<void()> {
    ++made;
    for (const auto& p : part->parameters()) EXPECT_TRUE(p.grad().defined());
    return [&runs] { ++runs; };
  };
  const StepTail tail =
      measure_step_tail(config, 8, torch::kFloat32, c10::kCPU, model::Kernels::kReference, runner,
                        /*reps=*/2, /*rounds=*/2);
  EXPECT_TRUE(tail.measured);
  EXPECT_EQ(made, 2);
  EXPECT_EQ(runs, 2 * (2 + 2 * 2));  // each part: 2 untimed, then 2 rounds of 2
}

// The line through the two parts, and where it cannot be drawn, the mean per parameter.
TEST(LayerProfile, StepTailFitsFixedPlusPerParameter) {
  const StepTail line = fit_step_tail(100, 3.0, 400, 6.0);
  EXPECT_DOUBLE_EQ(line.per_parameter, 0.01);
  EXPECT_DOUBLE_EQ(line.fixed, 2.0);
  EXPECT_TRUE(line.measured);
  const StepTail steep = fit_step_tail(100, 1.0, 400, 8.0);  // below zero at 0 parameters
  EXPECT_EQ(steep.fixed, 0.0);
  EXPECT_DOUBLE_EQ(steep.per_parameter, 8.0 / 400);
  const StepTail flat = fit_step_tail(100, 3.0, 400, 2.0);  // noise: the chain came out cheaper
  EXPECT_EQ(flat.fixed, 0.0);
  EXPECT_DOUBLE_EQ(flat.per_parameter, 2.0 / 400);
  const StepTail one = fit_step_tail(100, 3.0, 0, 0);  // one block: no chain
  EXPECT_EQ(one.fixed, 0.0);
  EXPECT_DOUBLE_EQ(one.per_parameter, 0.03);
  EXPECT_NE(error_of([] { fit_step_tail(0, 1.0, 10, 1.0); }).find("0 parameters"),
            std::string::npos);
}

// A 12-block, 32-wide model with a small vocabulary: planned in well under a second on the CPU.
model::GPT2Config small_plan_model() {
  auto config = model::preset("tiny");
  config.n_layer = 12;
  config.n_embd = 32;
  config.n_head = 2;
  config.vocab_size = 300;
  return config;
}

// A plan of `stages` stages for `batch` sequences of 8 tokens at each M of `microbatches`, with
// one timed repetition (the planner's arithmetic is under test, not the timings).
PlanSpec small_plan_spec(int stages, int64_t batch, std::vector<int> microbatches) {
  PlanSpec spec;
  spec.stages = stages;
  spec.batch_size = batch;
  spec.seq_len = 8;
  spec.microbatches = std::move(microbatches);
  spec.reps = 1;
  return spec;
}

TEST(Plan, EveryPartitionScheduleAndMRelativeToModelParallel) {
  const auto config = small_plan_model();
  PlanSpec spec = small_plan_spec(8, 4, {1, 2});
  const Plan plan = make_plan(config, spec, c10::kCPU);
  EXPECT_EQ(plan.times.size(), 2U);  // 4 and 2 rows
  // 12 blocks on 8 stages: HW5's ceil(12/8) = 2 per stage fills 6 stages and leaves one empty.
  ASSERT_EQ(plan.notes.size(), 1U);
  EXPECT_NE(plan.notes[0].find("no uniform split"), std::string::npos) << plan.notes[0];
  // balanced and measured: M = 1 (model_parallel) + M = 2 (gpipe, 1f1b).
  ASSERT_EQ(plan.rows.size(), 6U);
  for (const auto& r : plan.rows) {
    EXPECT_NE(r.partition, PartitionKind::kUniform);
    EXPECT_GT(r.step_s, 0.0);
    EXPECT_EQ(r.stage_busy_s.size(), 8U);
    if (r.schedule == "model_parallel") {
      EXPECT_DOUBLE_EQ(r.speedup, 1.0);
    }
  }
  const auto doc = to_json(plan, 12);
  EXPECT_EQ(doc["predictions"].size(), 6U);
  EXPECT_EQ(doc["layer_costs_s_by_rows"]["2"].size(), 14U);
  EXPECT_NE(error_of([&] {
              PlanSpec bad = spec;
              bad.microbatches = {3};
              make_plan(config, bad, c10::kCPU);
            }).find("3 micro-batches do not divide the batch of 4"),
            std::string::npos);
}

// The step tail depends on the model and the device, not on the split: make_plan takes one timed
// already, and plan_hybrid times it once for all of its D x P splits.
TEST(Plan, TheStepTailIsTimedOncePerPlan) {
  const auto config = small_plan_model();
  int timed = 0;
  PlanSpec spec = small_plan_spec(1, 4, {1, 2});
  spec.step_tail = [&timed](model::GPT2&) -> std::function<void()> {
    ++timed;
    return [] {};
  };
  const HybridPlan hybrid = plan_hybrid(config, spec, 4, 100, c10::kCPU);
  EXPECT_EQ(hybrid.picks.size(), 3U);  // D = 1, 2, 4
  EXPECT_EQ(timed, 2);                 // one block, then a chain: once
  PlanSpec known = spec;
  known.tail.measured = true;
  known.tail.fixed = 0.5;
  const Plan plan = make_plan(config, known, c10::kCPU);
  EXPECT_EQ(timed, 2);  // not timed again
  EXPECT_DOUBLE_EQ(plan.tail.fixed, 0.5);
  // Every row ends with the given tail: half a second on top of the layers' microseconds.
  for (const auto& r : plan.rows) EXPECT_GT(r.step_s, 0.5);
}

TEST(Plan, InterleavedRowsSplitIntoStagesTimesVAndNeedMAMultipleOfTheRanks) {
  const auto config = small_plan_model();
  PlanSpec spec =
      small_plan_spec(2, 12, {3, 4});  // 3 is no multiple of 2 ranks: no interleaved row
  spec.stages_per_rank = {1, 3};
  const Plan plan = make_plan(config, spec, c10::kCPU);
  int interleaved = 0;
  for (const auto& r : plan.rows) {
    EXPECT_EQ(r.stage_busy_s.size(), 2U);
    if (r.schedule != "interleaved") {
      EXPECT_EQ(r.stages_per_rank, 1);
      continue;
    }
    ++interleaved;
    EXPECT_EQ(r.stages_per_rank, 3);
    EXPECT_EQ(r.microbatches, 4);
    EXPECT_EQ(std::count(r.split.begin(), r.split.end(), '|'), 5) << r.split;  // 6 stages
    EXPECT_DOUBLE_EQ(r.ideal, 2.0 * 12 / (12 + 1));
    EXPECT_GT(r.speedup, 0.0);
  }
  EXPECT_EQ(interleaved, 3);  // one per partition
  EXPECT_EQ(to_json(plan, 12)["predictions"][0]["stages_per_rank"], 1);
}

TEST(Plan, ZeroBubbleRowsForEachMemoryAllowanceWithTheirOwnIdeal) {
  const auto config = small_plan_model();
  PlanSpec spec = small_plan_spec(2, 8, {4});
  spec.stages_per_rank = {1};
  spec.zero_bubble = true;
  spec.zb_extra_live = {0, kNoLiveLimit};
  const Plan plan = make_plan(config, spec, c10::kCPU);
  const double w = block_weight_share(static_cast<int>(config.n_embd), 8);
  int plain = 0, bounded = 0, unlimited = 0;
  for (const auto& r : plan.rows) {
    ASSERT_EQ(r.microbatches, 4);  // model_parallel is the baseline, not a row of its own here
    if (!r.zero_bubble) {
      ++plain;
      EXPECT_DOUBLE_EQ(r.ideal, 2.0 * 4 / (4 + 1));
      continue;
    }
    ++(r.zb_extra_live == 0 ? bounded : unlimited);
    EXPECT_DOUBLE_EQ(r.ideal, 2.0 * 4 / (4 + (1 - 2 * w))) << r.schedule;
    EXPECT_GT(r.ideal, 2.0 * 4 / (4 + 1));
  }
  // 3 partitions x (gpipe, 1f1b), each plain and at both allowances.
  EXPECT_EQ(plain, 6);
  EXPECT_EQ(bounded, 6);
  EXPECT_EQ(unlimited, 6);
  const auto rows = to_json(plan, static_cast<int>(config.n_layer))["predictions"];
  EXPECT_EQ(rows[2]["zb_extra_live"], kNoLiveLimit) << rows[2];
  spec.zb_extra_live = {-3};
  EXPECT_NE(error_of([&] {
              make_plan(config, spec, c10::kCPU);
            }).find("zero-bubble extra live micro-batches -3"),
            std::string::npos);
}

// pp_plan sits in the build directory, one level above this test binary.
std::string plan_binary() {
  namespace fs = std::filesystem;
  return (fs::read_symlink("/proc/self/exe").parent_path().parent_path() / "pp_plan").string();
}

TEST(PpPlan, PredictsEveryPartitionScheduleAndM) {
  ASSERT_TRUE(std::filesystem::exists(plan_binary())) << plan_binary() << " (build target pp_plan)";
  testing::TempDir dir;
  const std::string json = (dir / "plan.json");
  const std::string cmd = plan_binary() +
                          " --device cpu --preset tiny --n-layer 2 --vocab-size 300 --stages 2"
                          " --batch-size 4 --seq-len 8 --microbatches 2,4 --reps 1 --json-out " +
                          json + " > " + (dir / "out.txt") + " 2> " + (dir / "err.txt");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const auto doc = nlohmann::json::parse(std::ifstream(json));
  EXPECT_EQ(doc["stages"], 2);
  // --kernels auto on the CPU: the layers were timed on the reference path, as pp_train runs.
  EXPECT_EQ(doc["kernels"], "reference");
  // No GPU, so no CUDA graphs: the layers were launched eagerly, and the table says why.
  EXPECT_EQ(doc["layers_timed_as"], "eager");
  EXPECT_EQ(doc["layers_eager_because"], "the device is not a GPU");
  EXPECT_EQ(doc["loss_positions"], "targets");  // pp_train's default
  // The timing, the slow part, is announced on stderr one micro-batch size at a time.
  std::ifstream err(dir / "err.txt");
  const std::string said((std::istreambuf_iterator<char>(err)), std::istreambuf_iterator<char>());
  for (const char* step : {"micro-batches of 4 rows (M = 1, 1 of 3) on cpu",
                           "micro-batches of 2 rows (M = 2, 2 of 3) on cpu",
                           "micro-batches of 1 rows (M = 4, 3 of 3) on cpu"}) {
    EXPECT_NE(said.find(std::string("pp_plan: timing the layers at ") + step), std::string::npos)
        << said;
  }
  // M = 1 is always timed (the model-parallel baseline): rows 4, 2 and 1.
  EXPECT_EQ(doc["layer_costs_s_by_rows"].size(), 3U);
  // The step after the schedule (the trainer's norm, AdamW and zeroing) is timed and announced,
  // and every prediction ends with it.
  EXPECT_NE(said.find("pp_plan: timing the step after the schedule"), std::string::npos) << said;
  ASSERT_TRUE(doc["step_tail"].is_object()) << doc.dump();
  EXPECT_GE(doc["step_tail"]["fixed_s"].get<double>(), 0.0);
  EXPECT_GT(doc["step_tail"]["per_parameter_s"].get<double>(), 0.0);
  EXPECT_EQ(doc["layer_costs_s_by_rows"]["4"].size(), 4U);  // embedding, 2 blocks, head
  EXPECT_GE(doc["stage_overhead_s_by_rows"]["4"].get<double>(), 0.0);
  // 3 partitions x 2 M x 2 schedules.
  ASSERT_EQ(doc["predictions"].size(), 12U);
  for (const auto& p : doc["predictions"]) {
    EXPECT_GT(p["step_s"].get<double>(), 0.0);
    EXPECT_GT(p["speedup_vs_model_parallel"].get<double>(), 0.0);
    const int m = p["microbatches"];
    EXPECT_DOUBLE_EQ(p["ideal_speedup"].get<double>(), 2.0 * m / (m + 1));
  }
  // The table ends with the fastest plan as pp_train flags.
  std::ifstream out(dir / "out.txt");
  const std::string text((std::istreambuf_iterator<char>(out)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("# fastest: pp_train --partition "), std::string::npos) << text;
  EXPECT_NE(text.find(", reference kernels, "), std::string::npos) << text;
  EXPECT_NE(text.find("(forward + backward), launched eagerly: the device is not a GPU"),
            std::string::npos)
      << text;
}

// The layers are timed as pp_train would run the plan's stages: as CUDA graphs unless one of its
// reasons to launch them eagerly holds, each named as pp_train names it.
TEST(PlanGraphBlocker, NamesWhyTheStagesWouldRunEagerly) {
  const c10::Device gpu(c10::kCUDA, 0);
  PlanSpec spec;
  spec.loss_fraction = 1.0;
  EXPECT_EQ(plan_graph_blocker(spec, c10::kCPU), "the device is not a GPU");
  const std::string none = plan_graph_blocker(spec, gpu);
  // A CPU build cannot capture on any device; a CUDA build can here.
  EXPECT_TRUE(none.empty() || none == "the device is not a GPU") << none;
  const auto blocked = [&](const std::function<void(PlanSpec&)>& change, const char* why) {
    PlanSpec s = spec;
    change(s);
    const std::string got = plan_graph_blocker(s, gpu);
    EXPECT_TRUE(got.find(why) != std::string::npos || (!none.empty() && got == none)) << got;
  };
  blocked([](PlanSpec& s) { s.cuda_graphs = false; }, "--cuda-graphs off");
  blocked([](PlanSpec& s) { s.loss_fraction = 0.09; }, "target positions only");
  blocked([](PlanSpec& s) { s.recompute = model::Recompute::kBlocks; }, "--recompute blocks");
  blocked([](PlanSpec& s) { s.zero_bubble = true; }, "--zero-bubble");
  blocked([](PlanSpec& s) { s.replicas = 2; }, "replicas");
  spec.cuda_graphs = false;
  EXPECT_EQ(plan_graph_blocker(spec, c10::kCPU), "--cuda-graphs off");
}

// pp_plan and pp_train ask one question (graph_terms.h): the same run gives the same terms from
// pp_plan's plan and from pp_train's flags, for every reason either can give.
TEST(PlanGraphBlocker, ReadsTheTermsAsPpTrainDoes) {
  for (const c10::Device device : {c10::Device(c10::kCUDA, 0), c10::Device(c10::kCPU)}) {
    const auto same = [&](const std::function<void(PlanSpec&, parallel::TrainConfig&, int&)>& f) {
      PlanSpec spec;
      spec.loss_fraction = 1.0;
      parallel::TrainConfig cfg;
      cfg.compute.loss_positions = model::LossPositions::kAll;
      int replicas = 1;
      f(spec, cfg, replicas);
      const GraphTerms plan = plan_graph_terms(spec, device);
      const GraphTerms train = parallel::pipeline_graph_terms(cfg, device, replicas);
      EXPECT_TRUE(plan == train) << device;
      EXPECT_EQ(graph_blocker(plan), plan_graph_blocker(spec, device));
      return plan;
    };
    const GraphTerms none = same([](PlanSpec&, parallel::TrainConfig&, int&) {});
    EXPECT_EQ(none.gpu, device.is_cuda());
    EXPECT_FALSE(same([](PlanSpec& s, parallel::TrainConfig& c, int&) {
                   s.cuda_graphs = false;
                   c.compute.cuda_graphs = parallel::CudaGraphs::kOff;
                 }).requested);
    EXPECT_FALSE(same([](PlanSpec& s, parallel::TrainConfig& c, int&) {
                   s.loss_fraction = 0.09;
                   c.compute.loss_positions = model::LossPositions::kTargets;
                 }).every_position);
    // pp_train --loss-positions all on HW5's data: the head everywhere, 9% of it weighted.
    EXPECT_TRUE(same([](PlanSpec& s, parallel::TrainConfig&, int&) {
                  s.loss_fraction = 0.09;
                  s.loss_positions = model::LossPositions::kAll;
                }).every_position);
    EXPECT_TRUE(same([](PlanSpec& s, parallel::TrainConfig& c, int&) {
                  s.recompute = model::Recompute::kBlocks;
                  c.compute.recompute = model::Recompute::kBlocks;
                }).recompute);
    EXPECT_TRUE(same([](PlanSpec& s, parallel::TrainConfig& c, int&) {
                  s.zero_bubble = true;
                  c.pipeline.zero_bubble = true;
                }).zero_bubble);
    EXPECT_EQ(same([](PlanSpec& s, parallel::TrainConfig&, int& replicas) {
                s.replicas = 2;
                replicas = 2;
              }).replicas,
              2);
  }
}

// Each term's reason, first one first. Without CUDA in the build every GPU run is "not a GPU".
TEST(PlanGraphBlocker, NamesEachReason) {
  GraphTerms terms;
  terms.gpu = true;
  const bool cuda = compat::cuda_graphs_built();
  EXPECT_EQ(graph_blocker(terms), cuda ? "" : "the device is not a GPU");
  const auto reason = [&](const std::function<void(GraphTerms&)>& change) {
    GraphTerms t = terms;
    change(t);
    return graph_blocker(t);
  };
  EXPECT_EQ(reason([](GraphTerms& t) {
              t.requested = false;
              t.replicas = 2;
            }),
            "--cuda-graphs off");
  EXPECT_EQ(reason([](GraphTerms& t) { t.gpu = false; }), "the device is not a GPU");
  if (!cuda) return;
  EXPECT_NE(
      reason([](GraphTerms& t) { t.every_position = false; }).find("--loss-positions targets"),
      std::string::npos);
  EXPECT_NE(reason([](GraphTerms& t) { t.recompute = true; }).find("--recompute blocks"),
            std::string::npos);
  EXPECT_NE(reason([](GraphTerms& t) { t.zero_bubble = true; }).find("--zero-bubble"),
            std::string::npos);
  EXPECT_NE(reason([](GraphTerms& t) { t.replicas = 2; }).find("--dp above 1"), std::string::npos);
}

// --gpus 4: every D x P = 4 the model allows (4 blocks: 4 x 1, 2 x 2, 1 x 4), each at its fastest
// plan for a replica's batch plus the replicas' all-reduce, ranked, the first as pp_train flags.
TEST(PpPlan, HybridPredictsEverySplitOfTheGpus) {
  testing::TempDir dir;
  const std::string json = (dir / "hybrid.json");
  const std::string cmd = plan_binary() +
                          " --device cpu --preset tiny --n-layer 4 --vocab-size 300 --gpus 4"
                          " --batch-size 8 --seq-len 8 --microbatches 1,2,4 --reps 1"
                          " --allreduce-gbs 100 --json-out " +
                          json + " > " + (dir / "out.txt");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const auto doc = nlohmann::json::parse(std::ifstream(json));
  ASSERT_EQ(doc["hybrid"].size(), 3U);
  double previous = 0;
  std::set<int> replicas;
  for (const auto& r : doc["hybrid"]) {
    const int dp = r["dp"], pp = r["pp"];
    EXPECT_EQ(dp * pp, 4);
    replicas.insert(dp);
    EXPECT_EQ(8 / dp % r["microbatches"].get<int>(), 0);  // M divides a replica's batch
    // One replica has nothing to sum; more replicas sum their gradients.
    EXPECT_EQ(r["allreduce_s"].get<double>() > 0, dp > 1);
    EXPECT_DOUBLE_EQ(r["step_s"].get<double>(),
                     r["pipeline_step_s"].get<double>() + r["allreduce_s"].get<double>());
    EXPECT_GE(r["step_s"].get<double>(), previous);  // fastest first
    EXPECT_EQ(r["layers_timed_as"], "eager");        // the CPU
    previous = r["step_s"].get<double>();
  }
  EXPECT_EQ(replicas, (std::set<int>{1, 2, 4}));
  std::ifstream out(dir / "out.txt");
  const std::string text((std::istreambuf_iterator<char>(out)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("# pick on 4 GPU(s): mpirun -np 4 pp_train --dp " +
                      std::to_string(doc["hybrid"][0]["dp"].get<int>())),
            std::string::npos)
      << text;
}

// --recompute blocks --zero 1 --gpus 4: every D x P row has each rank's peak memory, estimated
// on the CPU. One rank holding the whole model over D = 4 replicas keeps its 8 bytes of weight
// and gradient per parameter, 4 of gradient buckets, a quarter of the moments and its shard's
// reduced gradient (15 in all): at least 10 and below the unsharded 16 bytes per parameter (its
// activations are a few hundred kB here). Without replicas nothing is sharded: the 4 ranks of D = 1
// hold at least 16 bytes per parameter together.
TEST(PpPlan, HybridPredictsPeakMemoryWithRecomputeAndZeroOne) {
  testing::TempDir dir;
  const std::string json = (dir / "hybrid.json");
  const std::string cmd = plan_binary() +
                          " --device cpu --preset tiny --n-layer 4 --vocab-size 300 --gpus 4"
                          " --batch-size 8 --seq-len 8 --microbatches 1,2,4 --reps 1"
                          " --recompute blocks --zero 1 --json-out " +
                          json + " > " + (dir / "out.txt");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const auto doc = nlohmann::json::parse(std::ifstream(json));
  EXPECT_EQ(doc["recompute"], "blocks");
  EXPECT_EQ(doc["zero"], 1);
  auto config = model::preset("tiny");
  config.n_layer = 4;
  config.vocab_size = 300;
  const double params = static_cast<double>(config.num_parameters());
  ASSERT_EQ(doc["hybrid"].size(), 3U);
  for (const auto& r : doc["hybrid"]) {
    const int dp = r["dp"], pp = r["pp"];
    SCOPED_TRACE("D=" + std::to_string(dp));
    EXPECT_EQ(r["peak_memory_measured"], false);
    const auto peaks = r["peak_memory_bytes"].get<std::vector<double>>();
    ASSERT_EQ(peaks.size(), static_cast<size_t>(pp));
    double sum = 0;
    for (double b : peaks) {
      EXPECT_GT(b, 0.0);
      sum += b;
    }
    if (pp == 1) {
      EXPECT_GE(sum, 10 * params);
      EXPECT_LT(sum, 16 * params);
    }
    if (dp == 1) {
      EXPECT_GE(sum, 16 * params);
    }
  }
  std::ifstream out(dir / "out.txt");
  const std::string text((std::istreambuf_iterator<char>(out)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("peak_GiB"), std::string::npos) << text;
  EXPECT_NE(text.find("estimated from the shapes"), std::string::npos) << text;
  EXPECT_NE(text.find("--recompute blocks"), std::string::npos) << text;
}

TEST(PpPlan, AMicroBatchCountThatDoesNotDivideTheBatchIsAUsageError) {
  testing::TempDir dir;
  const std::string cmd = plan_binary() + " --device cpu --batch-size 16 --microbatches 3 > " +
                          (dir / "err.txt") + " 2>&1";
  const int status = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 2);
  std::ifstream err(dir / "err.txt");
  const std::string text((std::istreambuf_iterator<char>(err)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("3 does not divide --batch-size 16"), std::string::npos) << text;
}

// --cuda-graphs as pp_train takes it: off is named as the reason the layers ran eagerly; a word
// that is not auto or off is a usage error naming both.
TEST(PpPlan, CudaGraphsOffIsNamedAndABadWordIsAUsageError) {
  testing::TempDir dir;
  const std::string json = (dir / "plan.json");
  const std::string ok = plan_binary() +
                         " --device cpu --preset tiny --n-layer 2 --vocab-size 300 --stages 2"
                         " --batch-size 4 --seq-len 8 --microbatches 2 --reps 1 --cuda-graphs off"
                         " --json-out " +
                         json + " > " + (dir / "out.txt") + " 2>&1";
  ASSERT_EQ(std::system(ok.c_str()), 0) << ok;
  const auto doc = nlohmann::json::parse(std::ifstream(json));
  EXPECT_EQ(doc["layers_timed_as"], "eager");
  EXPECT_EQ(doc["layers_eager_because"], "--cuda-graphs off");
  const std::string bad =
      plan_binary() + " --device cpu --cuda-graphs sometimes > " + (dir / "err.txt") + " 2>&1";
  const int status = std::system(bad.c_str());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 2);
  std::ifstream err(dir / "err.txt");
  const std::string text((std::istreambuf_iterator<char>(err)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("--cuda-graphs 'sometimes' is not one of"), std::string::npos) << text;
  EXPECT_NE(text.find("auto"), std::string::npos) << text;
  EXPECT_NE(text.find("off"), std::string::npos) << text;
}

// --profile DIR traces the layer timing (where libtorch has its profiler); a file in its place is a
// usage error that leaves the file as it was.
TEST(PpPlan, ProfileWritesATraceIntoAFolder) {
  testing::TempDir dir;
  const std::string file = (dir / "taken");
  std::ofstream(file) << "keep\n";
  const std::string base = plan_binary() +
                           " --device cpu --preset tiny --n-layer 2 --vocab-size 300 --stages 1"
                           " --batch-size 2 --seq-len 8 --microbatches 1 --stages-per-rank 1"
                           " --reps 1 --profile ";
  const auto run = [&](const std::string& where, const std::string& log) {
    const std::string cmd = base + where + " > " + (dir / log) + " 2>&1";
    const int status = std::system(cmd.c_str());
    EXPECT_TRUE(WIFEXITED(status)) << cmd;
    std::ifstream in(dir / log);
    return std::make_pair(WEXITSTATUS(status), std::string((std::istreambuf_iterator<char>(in)),
                                                           std::istreambuf_iterator<char>()));
  };
  const auto [rc, text] = run(file, "file.txt");
  EXPECT_EQ(rc, 2) << text;
  EXPECT_NE(text.find("--profile " + file + ": not a directory"), std::string::npos) << text;
  std::ifstream kept(file);
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(kept)), std::istreambuf_iterator<char>()),
            "keep\n");
  const std::string folder = (dir / "trace");
  const auto [rc2, text2] = run(folder, "dir.txt");
  if (!compat::Profiler::available()) {  // refused as the trainers refuse it
    EXPECT_EQ(rc2, 1) << text2;
    EXPECT_NE(text2.find("without Kineto"), std::string::npos) << text2;
    return;
  }
  ASSERT_EQ(rc2, 0) << text2;
  const auto trace = nlohmann::json::parse(std::ifstream(folder + "/trace.json"));
  EXPECT_FALSE(trace["traceEvents"].empty());
  EXPECT_NE(text2.find("# profile of the layer timing written to " + folder + "/trace.json"),
            std::string::npos)
      << text2;
}

}  // namespace
}  // namespace gpt2p::pipeline
