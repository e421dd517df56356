// Predicted step times: the textbook results for equal stages, and what the cost of the slowest
// stage and of transfers does to them. Predicted peak memory per rank: weights, gradients and
// AdamW's moments (ZeRO-1 divides the moments by the replicas) plus the activations a schedule
// keeps alive, with and without recomputing the blocks.
#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>
#include <string>

#include "gpt2p/core/error.h"
#include "gpt2p/model/config.h"
#include "gpt2p/pipeline/perf/memory.h"
#include "gpt2p/pipeline/perf/planner.h"
#include "gpt2p/pipeline/perf/predict.h"
#include "support/errors.h"

namespace gpt2p::pipeline {
namespace {

using testing::error_of;

// n stages of 3 equal layers... plus embedding and head as free layers: every stage costs 3.
std::vector<double> equal_stage_costs(int n) {
  std::vector<double> costs(static_cast<size_t>(n) + 2, 3.0);
  costs.front() = 0.0;
  costs.back() = 0.0;
  return costs;
}

TEST(Predict, EqualStagesGiveGPipesBubble) {
  for (int n : {2, 3, 4}) {
    const auto costs = equal_stage_costs(n);
    const auto split = partition_balanced(costs, n);
    for (int m : {1, 2, 4, 8}) {
      SCOPED_TRACE("n=" + std::to_string(n) + " m=" + std::to_string(m));
      const auto p = predict_step(ScheduleKind::kGPipe, m, split, costs);
      // (m + n - 1) ticks of forward (1) and of backward (2).
      EXPECT_NEAR(p.step, 3.0 * (m + n - 1), 1e-9);
      EXPECT_NEAR(p.bubble, (n - 1.0) / (m + n - 1.0), 1e-9);
      ASSERT_EQ(p.stage_busy.size(), static_cast<size_t>(n));
      EXPECT_NEAR(p.stage_busy[0], 3.0 * m, 1e-9);
      // 1F1B has the same makespan as GPipe with equal stages and free transfers.
      EXPECT_NEAR(predict_step(ScheduleKind::kOneFOneB, m, split, costs).step, p.step, 1e-9);
    }
  }
}

TEST(Predict, OneMicroBatchIsTheSumOfTheStages) {
  const std::vector<double> costs{0.5, 2.0, 2.0, 2.0, 6.0};  // embedding, 3 blocks, head
  const Partition split{{0, 2}, {2, 5}};                     // 2.5 | 10
  const auto p = predict_step(ScheduleKind::kGPipe, 1, split, costs);
  EXPECT_NEAR(p.step, 12.5, 1e-9);
  EXPECT_NEAR(p.bubble, 1.0 - 12.5 / (2 * 12.5), 1e-9);
}

TEST(Predict, TheSlowestStageSetsTheSteadyState) {
  // Stage costs 2 and 4: with many micro-batches the step approaches m x 4.
  const std::vector<double> costs{0.0, 2.0, 4.0, 0.0};
  const Partition split{{0, 2}, {2, 4}};
  const auto p = predict_step(ScheduleKind::kOneFOneB, 16, split, costs);
  EXPECT_GE(p.step, 16 * 4.0);
  EXPECT_LE(p.step, 16 * 4.0 + 2.0 + 1e-9);  // plus one pass through the faster stage
}

// The work after the schedule runs per rank, its stages one after another, and the step ends with
// the slowest rank's: rank r holds stages r, r + n, ... (interleaved).
TEST(Predict, TheSlowestRanksTailEndsTheStep) {
  const std::vector<double> costs(8, 1.0);
  const Partition four{{0, 2}, {2, 4}, {4, 6}, {6, 8}};
  StepModel model;
  model.stages_per_rank = 2;
  const auto bare = predict_step(ScheduleKind::kInterleaved, 4, four, costs, model);
  EXPECT_EQ(bare.tail, 0.0);
  model.stage_tail = {1.0, 0.5, 2.0, 0.25};  // rank 0: stages 0 and 2, rank 1: stages 1 and 3
  const auto tailed = predict_step(ScheduleKind::kInterleaved, 4, four, costs, model);
  EXPECT_DOUBLE_EQ(tailed.tail, 3.0);
  EXPECT_DOUBLE_EQ(tailed.step, bare.step + 3.0);
  EXPECT_EQ(tailed.bubble, bare.bubble);  // the schedule itself is untouched
  model.stage_tail = {1.0, 2.0};
  EXPECT_NE(error_of([&] {
              predict_step(ScheduleKind::kInterleaved, 4, four, costs, model);
            }).find("2 stage tails for 4 stages"),
            std::string::npos);
  model.stage_tail = {1.0, -1.0, 0.0, 0.0};
  EXPECT_NE(error_of([&] {
              predict_step(ScheduleKind::kInterleaved, 4, four, costs, model);
            }).find("stage 1's tail -1 < 0"),
            std::string::npos);
}

TEST(Predict, TransfersAddToTheCriticalPath) {
  const auto costs = equal_stage_costs(2);
  const auto split = partition_balanced(costs, 2);
  const double free = predict_step(ScheduleKind::kGPipe, 4, split, costs).step;
  const double paid = predict_step(ScheduleKind::kGPipe, 4, split, costs, {0.5}).step;
  EXPECT_GE(paid, free + 2 * 0.5);  // at least one activation and one gradient on the path
}

// The per-call overhead is paid once per stage and micro-batch, whatever the stage holds: on one
// stage, m micro-batches cost m x (layers + overhead).
TEST(Predict, StageOverheadIsPaidPerStageAndMicroBatch) {
  const std::vector<double> costs{0.5, 2.0, 2.0, 2.0, 6.0};
  const Partition one{{0, 5}};
  StepModel model;
  model.stage_overhead = 0.25;
  EXPECT_NEAR(predict_step(ScheduleKind::kOneFOneB, 4, one, costs, model).step, 4 * 12.75, 1e-9);
  // Two stages pay it twice per micro-batch: model parallelism costs 12.5 + 2 x 0.25.
  const Partition two{{0, 2}, {2, 5}};
  EXPECT_NEAR(predict_step(ScheduleKind::kGPipe, 1, two, costs, model).step, 13.0, 1e-9);
  model.stage_overhead = -1;
  EXPECT_NE(error_of([&] {
              predict_step(ScheduleKind::kGPipe, 1, two, costs, model);
            }).find("stage overhead -1 < 0"),
            std::string::npos);
}

TEST(Predict, ZeroBubbleFillsTheBubbleWithWeightGradients) {
  for (int n : {2, 3, 4}) {
    const auto costs = equal_stage_costs(n);
    const auto split = partition_balanced(costs, n);
    for (int m : {2, 4, 8}) {
      SCOPED_TRACE("n=" + std::to_string(n) + " m=" + std::to_string(m));
      StepModel zb;
      zb.zero_bubble = true;
      zb.block_weight_share = 1.0 / 3.0;  // F 1, B 1, W 1 per stage
      const auto plain = predict_step(ScheduleKind::kOneFOneB, m, split, costs);
      const auto split_bw = predict_step(ScheduleKind::kOneFOneB, m, split, costs, zb);
      EXPECT_LT(split_bw.step, plain.step) << "W's fill the cool-down";
      EXPECT_GE(split_bw.step, 3.0 * m - 1e-9) << "no faster than the busy time";
      for (double busy : split_bw.stage_busy) EXPECT_NEAR(busy, 3.0 * m, 1e-9);
      // With no W to move, the split changes nothing.
      zb.block_weight_share = 0.0;
      EXPECT_NEAR(predict_step(ScheduleKind::kOneFOneB, m, split, costs, zb).step, plain.step,
                  1e-9);
    }
  }
}

TEST(Predict, BadInputSaysWhatToPass) {
  const auto costs = equal_stage_costs(2);
  const auto split = partition_balanced(costs, 2);
  EXPECT_NE(error_of([&] {
              predict_step(ScheduleKind::kGPipe, 0, split, costs);
            }).find("0 micro-batches"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              predict_step(ScheduleKind::kGPipe, 2, split, costs, {0.0, 1.0});
            }).find("forward_share 1"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              predict_step(ScheduleKind::kGPipe, 2, split, {1.0, 2.0});
            }).find("stage_costs"),
            std::string::npos);
}

// Recompute runs each block's forward again inside its backward: forward_share of the blocks'
// cost per micro-batch, and nothing for the embedding and the head.
TEST(Predict, RecomputeAddsOneForwardOfTheBlocksToEveryBackward) {
  const std::vector<double> costs{0.5, 2.0, 2.0, 2.0, 6.0};  // embedding, 3 blocks, head
  const Partition one{{0, 5}};
  StepModel model;
  model.recompute = model::Recompute::kBlocks;
  EXPECT_NEAR(predict_step(ScheduleKind::kOneFOneB, 4, one, costs, model).step,
              4 * (12.5 + 6.0 / 3.0), 1e-9);
  // Model parallelism over 0-1 | 2-4: 2.5 + 2/3 on the first stage, 10 + 4/3 on the second.
  const Partition two{{0, 2}, {2, 5}};
  const auto p = predict_step(ScheduleKind::kGPipe, 1, two, costs, model);
  EXPECT_NEAR(p.step, 12.5 + 2.0, 1e-9);
  EXPECT_NEAR(p.stage_busy[0], 2.5 + 2.0 / 3.0, 1e-9);
}

// A small model whose bytes can be counted by hand: C = 8, H = 2, V' = 64.
model::GPT2Config counted_model(double dropout) {
  model::GPT2Config c;
  c.n_layer = 6;
  c.n_head = 2;
  c.n_embd = 8;
  c.n_ctx = 16;
  c.vocab_size = 50;  // padded to 64
  c.dropout = dropout;
  return c;
}

// Per token, with e bytes per autocast element and d = 1 under dropout:
// block 16 + 4 H + 15 C e + 8 C + 2 C d; under bf16 once per step 24 C^2 of weight copies.
TEST(PredictMemory, TheEstimateCountsWhatTheReferencePathKeeps) {
  const double tokens = 2 * 4;  // 2 rows of 4 tokens
  const auto fp32 = estimate_activation_bytes(counted_model(0.1), 2, 4, false, 0.5);
  EXPECT_FALSE(fp32.measured);
  EXPECT_DOUBLE_EQ(fp32.block, tokens * (16 + 4 * 2 + 15 * 8 * 4 + 8 * 8 + 2 * 8));
  EXPECT_DOUBLE_EQ(fp32.block_recompute, tokens * 4 * 8);
  EXPECT_DOUBLE_EQ(fp32.stage_input, tokens * 4 * 8);
  EXPECT_DOUBLE_EQ(fp32.embedding, tokens * (8 + 4 * 8) + 8 * 4);
  // 2 loss positions per row: hidden-state gradient and index; the weight-sized gradient once.
  EXPECT_DOUBLE_EQ(fp32.head, tokens * 8 + 2 * 2 * (4 * 8 + 8) + 4.0 * 64 * 8);
  const auto bf16 = estimate_activation_bytes(counted_model(0.0), 2, 4, true, 0.5);
  EXPECT_DOUBLE_EQ(bf16.block, tokens * (16 + 4 * 2 + 15 * 8 * 2 + 8 * 8));
  EXPECT_DOUBLE_EQ(bf16.block_weight_copies, 24 * 8 * 8);
  EXPECT_DOUBLE_EQ(fp32.block_weight_copies, 0.0);
  EXPECT_DOUBLE_EQ(bf16.block_recompute, tokens * 4 * 8);
  EXPECT_DOUBLE_EQ(bf16.embedding, tokens * 4 * 8 + 8 * 4);
  EXPECT_NE(error_of([] {
              estimate_activation_bytes(counted_model(0.1), 0, 4, false, 1.0);
            }).find("rows 0"),
            std::string::npos);
}

// Made-up bytes per part, so that every term of the prediction is easy to tell apart.
ActivationBytes made_up_bytes() {
  ActivationBytes b;
  b.embedding = 100;
  b.block = 1000;
  b.block_recompute = 10;
  b.head = 5000;
  b.stage_input = 7;
  return b;
}

// Two stages, embedding + 3 blocks | 3 blocks + head, of the 6-block model above.
const Partition kTwoStages{{0, 4}, {4, 8}};

TEST(PredictMemory, StatesAreSixteenBytesPerParameterWithTheHeadsOwnWte) {
  const auto config = counted_model(0.1);
  const double block = static_cast<double>(config.layer_parameters(1));
  const double embedding = static_cast<double>(config.layer_parameters(0));
  EXPECT_DOUBLE_EQ(stage_parameters(config, kTwoStages[0]), embedding + 3 * block);
  EXPECT_DOUBLE_EQ(stage_parameters(config, kTwoStages[1]), 3 * block + 2 * 8 + 64 * 8);
  EXPECT_DOUBLE_EQ(stage_parameters(config, {0, 8}), static_cast<double>(config.num_parameters()));
  const auto schedule = make_schedule(ScheduleKind::kOneFOneB, 4, 2);
  const auto mem = predict_memory(config, kTwoStages, schedule, made_up_bytes(), {});
  ASSERT_EQ(mem.size(), 2U);
  EXPECT_DOUBLE_EQ(mem[0].states, 16 * (embedding + 3 * block));
  EXPECT_DOUBLE_EQ(mem[0].recompute, 0.0);
  // One replica at M = 4: the first stage also keeps the step's lookup gradients.
  EXPECT_DOUBLE_EQ(mem[0].lookup_grads, 4 * made_up_bytes().stage_input);
  EXPECT_DOUBLE_EQ(mem[0].total(), mem[0].states + mem[0].activations + mem[0].lookup_grads);
}

TEST(PredictMemory, ZeroOneDividesOnlyTheMomentsByTheReplicas) {
  const auto config = counted_model(0.1);
  const auto schedule = make_schedule(ScheduleKind::kOneFOneB, 4, 2);
  for (int d : {1, 2, 4}) {
    SCOPED_TRACE("D=" + std::to_string(d));
    const auto bytes = made_up_bytes();
    const auto plain = predict_memory(config, kTwoStages, schedule, bytes, {{}, d, false});
    const auto zero = predict_memory(config, kTwoStages, schedule, bytes, {{}, d, true});
    for (size_t r = 0; r < 2; ++r) {
      const double params = stage_parameters(config, kTwoStages[r]);
      // Replicas alone shard nothing, and add the buckets their gradients are summed in.
      EXPECT_DOUBLE_EQ(plain[r].states, (d == 1 ? 16 : 20) * params);
      EXPECT_DOUBLE_EQ(zero[r].states, (d == 1 ? 16 : 12 + 12.0 / d) * params);
      EXPECT_DOUBLE_EQ(zero[r].activations, plain[r].activations);
    }
  }
  EXPECT_NE(error_of([&] {
              predict_memory(config, kTwoStages, schedule, made_up_bytes(), {{}, 0, true});
            }).find("0 replicas"),
            std::string::npos);
}

// The step casts each block's weights once and every micro-batch's forward shares the copies: a
// rank holds them once per block it runs, however many micro-batches are alive.
TEST(PredictMemory, WeightCopiesCountOncePerBlockNotPerMicroBatch) {
  const auto config = counted_model(0.1);
  ActivationBytes bytes = made_up_bytes();
  bytes.block_weight_copies = 300;
  const auto schedule = [](int m) { return make_schedule(ScheduleKind::kGPipe, m, 2); };
  const auto one = predict_memory(config, kTwoStages, schedule(1), bytes, {});
  const auto eight = predict_memory(config, kTwoStages, schedule(8), bytes, {});
  for (size_t r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_DOUBLE_EQ(one[r].weight_copies, 3 * 300.0);  // 3 blocks on each stage
    EXPECT_DOUBLE_EQ(eight[r].weight_copies, one[r].weight_copies);
    EXPECT_DOUBLE_EQ(eight[r].activations, 8 * one[r].activations);
    EXPECT_DOUBLE_EQ(one[r].total(), one[r].states + one[r].activations + one[r].weight_copies);
  }
  // The embedding and the head alone hold no block.
  const Partition ends{{0, 1}, {1, 7}, {7, 8}};
  const auto mem =
      predict_memory(config, ends, make_schedule(ScheduleKind::kGPipe, 2, 3), bytes, {});
  EXPECT_DOUBLE_EQ(mem[0].weight_copies, 0.0);
  EXPECT_DOUBLE_EQ(mem[1].weight_copies, 6 * 300.0);
  EXPECT_DOUBLE_EQ(mem[2].weight_copies, 0.0);
}

// The first stage of one replica keeps the step's token-lookup gradients, M micro-batches of
// [rows, T, C] float32 (the size of a stage's input), to sum them once: at M > 1, not with
// replicas (whose stages keep the per-micro-batch lookup), and on no other rank.
TEST(PredictMemory, TheFirstStageKeepsTheStepsLookupGradients) {
  const auto config = counted_model(0.1);
  ActivationBytes bytes = made_up_bytes();
  bytes.stage_input = 50;
  const auto at = [&](int m, int replicas) {
    return predict_memory(config, kTwoStages, make_schedule(ScheduleKind::kOneFOneB, m, 2), bytes,
                          {{}, replicas, false});
  };
  const auto four = at(4, 1), one = at(1, 1), replicated = at(4, 2);
  EXPECT_DOUBLE_EQ(four[0].lookup_grads, 4 * 50.0);
  EXPECT_DOUBLE_EQ(four[1].lookup_grads, 0.0);
  EXPECT_DOUBLE_EQ(four[0].total(), four[0].states + four[0].activations + four[0].weight_copies +
                                        four[0].lookup_grads);
  EXPECT_DOUBLE_EQ(one[0].lookup_grads, 0.0);
  EXPECT_DOUBLE_EQ(replicated[0].lookup_grads, 0.0);
}

// 1F1B holds min(M, P - r) micro-batches on rank r, GPipe all M: with M > P every rank of 1F1B
// peaks lower, by whole micro-batches of its stage's bytes, and the simulator agrees on the count.
TEST(PredictMemory, OneFOneBPeaksBelowGPipeWhenMExceedsTheStages) {
  const auto config = counted_model(0.1);
  const Partition four{{0, 2}, {2, 4}, {4, 6}, {6, 8}};
  const std::vector<double> costs(8, 1.0);
  const auto kept = stage_activation_bytes(made_up_bytes(), four, 6, model::Recompute::kNone);
  EXPECT_DOUBLE_EQ(kept[0], 100 + 1000);
  EXPECT_DOUBLE_EQ(kept[1], 7 + 2 * 1000);
  EXPECT_DOUBLE_EQ(kept[3], 7 + 1000 + 5000);
  const int m = 8;
  const auto gpipe = predict_step(ScheduleKind::kGPipe, m, four, costs);
  const auto ofob = predict_step(ScheduleKind::kOneFOneB, m, four, costs);
  const auto g = predict_memory(config, four, gpipe.schedule, made_up_bytes(), {});
  const auto o = predict_memory(config, four, ofob.schedule, made_up_bytes(), {});
  for (size_t r = 0; r < 4; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_DOUBLE_EQ(g[r].activations, m * kept[r]);
    EXPECT_DOUBLE_EQ(o[r].activations, static_cast<double>(4 - r) * kept[r]);
    EXPECT_DOUBLE_EQ(o[r].activations, ofob.max_live_activations[r] * kept[r]);
    EXPECT_DOUBLE_EQ(g[r].activations, gpipe.max_live_activations[r] * kept[r]);
    EXPECT_LT(o[r].total(), g[r].total());
    EXPECT_DOUBLE_EQ(o[r].states, g[r].states);
  }
}

// Recompute keeps a block's output instead of its activations, and pays for one whole block at
// the peak: less memory as soon as a rank holds more than one block's worth.
TEST(PredictMemory, RecomputeKeepsLessButOneBlockWhole) {
  const auto config = counted_model(0.1);
  const auto schedule = make_schedule(ScheduleKind::kGPipe, 4, 2);
  MemoryModel recompute;
  recompute.recompute = model::Recompute::kBlocks;
  const auto none = predict_memory(config, kTwoStages, schedule, made_up_bytes(), {});
  const auto some = predict_memory(config, kTwoStages, schedule, made_up_bytes(), recompute);
  for (size_t r = 0; r < 2; ++r) {
    EXPECT_DOUBLE_EQ(none[r].activations - some[r].activations, 4 * 3 * (1000.0 - 10.0));
    EXPECT_DOUBLE_EQ(some[r].recompute, 1000.0);
    EXPECT_LT(some[r].total(), none[r].total());
  }
  // A stage with no block (the head alone) recomputes nothing.
  const Partition head_alone{{0, 7}, {7, 8}};
  const auto split = predict_memory(config, head_alone, schedule, made_up_bytes(), recompute);
  EXPECT_DOUBLE_EQ(split[0].recompute, 1000.0);
  EXPECT_DOUBLE_EQ(split[1].recompute, 0.0);
}

// Interleaved: a rank's live micro-batches belong to different stages, each weighing its own.
TEST(PredictMemory, InterleavedWeighsEachLiveMicroBatchByItsStage) {
  const Schedule schedule = make_schedule(ScheduleKind::kInterleaved, 4, 2, 2);
  const std::vector<double> bytes{1, 10, 100, 1000};  // stages 0, 2 on rank 0; 1, 3 on rank 1
  const auto peak = peak_activation_bytes(schedule, bytes);
  const auto sim = predict_step(ScheduleKind::kInterleaved, 4, {{0, 2}, {2, 3}, {3, 4}, {4, 8}},
                                std::vector<double>(8, 1.0), StepModel{0.0, 1.0 / 3, 2});
  ASSERT_EQ(peak.size(), 2U);
  for (size_t r = 0; r < 2; ++r) {
    const double small = bytes[r], large = bytes[r + 2];
    EXPECT_GT(peak[r], sim.max_live_activations[r] * small);
    EXPECT_LT(peak[r], sim.max_live_activations[r] * large);
  }
  EXPECT_NE(error_of([&] {
              peak_activation_bytes(schedule, {1, 2});
            }).find("names a stage"),
            std::string::npos);
}

// "0-6|7-13" (inclusive layers per stage, as a PlanRow's split) as a Partition.
Partition split_of(const std::string& text) {
  Partition split;
  std::stringstream ss(text);
  std::string stage;
  while (std::getline(ss, stage, '|')) {
    const auto dash = stage.find('-');
    split.push_back({std::stoi(stage.substr(0, dash)), std::stoi(stage.substr(dash + 1)) + 1});
  }
  return split;
}

// The same plan with recompute and with ZeRO-1 over 2 replicas: per rank, recompute keeps less
// (a stage's 6 blocks down to their outputs, plus one whole block); 2 replicas add their gradient
// buckets (4 bytes per parameter of the rank), and ZeRO-1 over them saves half the moments less
// the shard's reduced gradient (4 - 2 = 2 bytes per parameter). The measured split is left out of
// the comparison: a second measurement may cut elsewhere.
TEST(PredictMemory, ThePlannersRowsWithRecomputeAndZeroOne) {
  // 12 blocks, 32 wide, vocabulary 300: planned in well under a second on the CPU.
  auto config = model::preset("tiny");
  config.n_layer = 12;
  config.n_embd = 32;
  config.n_head = 2;
  config.vocab_size = 300;
  PlanSpec spec;  // 2 stages, 8 sequences of 8 tokens, M = 8, one timed repetition
  spec.batch_size = 8;
  spec.seq_len = 8;
  spec.microbatches = {8};
  spec.stages_per_rank = {1};
  spec.reps = 1;
  const Plan plain = make_plan(config, spec, c10::kCPU);
  spec.recompute = model::Recompute::kBlocks;
  const Plan recompute = make_plan(config, spec, c10::kCPU);
  spec.recompute = model::Recompute::kNone;
  spec.replicas = 2;
  const Plan replicated = make_plan(config, spec, c10::kCPU);
  spec.zero = 1;
  const Plan zero = make_plan(config, spec, c10::kCPU);
  ASSERT_EQ(plain.rows.size(), 6U);  // 3 partitions x (gpipe, 1f1b)
  ASSERT_EQ(recompute.rows.size(), plain.rows.size());
  ASSERT_EQ(zero.rows.size(), plain.rows.size());
  ASSERT_EQ(replicated.rows.size(), plain.rows.size());
  int compared = 0;
  for (size_t i = 0; i < plain.rows.size(); ++i) {
    const PlanRow &a = plain.rows[i], &b = recompute.rows[i], &z = zero.rows[i];
    SCOPED_TRACE(a.split + " " + a.schedule);
    ASSERT_EQ(a.peak_memory_bytes.size(), 2U);
    EXPECT_FALSE(a.peak_memory_measured);
    if (a.partition == PartitionKind::kMeasured) continue;
    ASSERT_EQ(a.split, b.split);
    ASSERT_EQ(a.split, z.split);
    ++compared;
    const auto split = split_of(a.split);
    ASSERT_EQ(split.size(), 2U);
    for (size_t r = 0; r < 2; ++r) {
      EXPECT_GT(a.peak_memory_bytes[r], 16 * stage_parameters(config, split[r]));
      EXPECT_LT(b.peak_memory_bytes[r], a.peak_memory_bytes[r]);
      const double unsharded = replicated.rows[i].peak_memory_bytes[r];
      // The replicas' gradient buckets; one replica's first stage keeps the step's lookup
      // gradients instead: M = 8 micro-batches of 1 x 8 tokens x C float32.
      const double lookup = r == 0 ? 8 * 8 * static_cast<double>(config.n_embd) * 4 : 0.0;
      EXPECT_NEAR(unsharded - a.peak_memory_bytes[r],
                  4 * stage_parameters(config, split[r]) - lookup, 1e-6 * unsharded);
      EXPECT_NEAR(unsharded - z.peak_memory_bytes[r], 2 * stage_parameters(config, split[r]),
                  1e-6 * unsharded);
    }
  }
  EXPECT_EQ(compared, 4);
  // GPipe keeps all 8 micro-batches on rank 0, 1F1B 2.
  const auto& gpipe = plain.rows[0];
  const auto& ofob = plain.rows[1];
  ASSERT_EQ(gpipe.schedule, "gpipe");
  ASSERT_EQ(ofob.schedule, "1f1b");
  EXPECT_LT(ofob.peak_memory_bytes[0], gpipe.peak_memory_bytes[0]);
  const auto doc = to_json(plain, 12);
  EXPECT_EQ(doc["predictions"][1]["peak_memory_bytes"].size(), 2U);
  EXPECT_EQ(doc["predictions"][1]["peak_memory_bytes"][0], ofob.peak_memory_bytes[0]);
  EXPECT_EQ(doc["predictions"][1]["peak_memory_measured"], false);
  EXPECT_EQ(doc["activation_bytes_by_rows"]["1"]["measured"], false);
  EXPECT_GT(doc["activation_bytes_by_rows"]["1"]["block"].get<double>(), 0.0);
  spec.zero = 2;
  EXPECT_NE(error_of([&] { make_plan(config, spec, c10::kCPU); }).find("--zero 2"),
            std::string::npos);
}

}  // namespace
}  // namespace gpt2p::pipeline
