// The pipeline planner behind pp_plan: layer times measured on one device (layer_profile.h) for
// every micro-batch size, the split each --partition gives, and the simulator's prediction
// (predict.h) for every partition x schedule x M, relative to model parallelism on the same split,
// with each rank's peak memory (memory.h).
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gpt2p/model/config.h"
#include "gpt2p/model/options.h"
#include "gpt2p/pipeline/perf/layer_profile.h"
#include "gpt2p/pipeline/plan/partition.h"
#include "gpt2p/pipeline/runtime/graph_terms.h"

namespace gpt2p::pipeline {

struct PlanSpec {
  int stages = 2;
  int64_t batch_size = 64;  // sequences per step (global)
  int64_t seq_len = 128;
  model::Precision precision = model::Precision::kFp32;  // as pp_train --precision
  // The layers' code path, resolved (kFused or kReference) as pp_train resolves its --kernels.
  model::Kernels kernels = model::Kernels::kReference;
  std::vector<int> microbatches{1, 2, 4, 8, 16};  // each divides batch_size
  // Stages per rank V: 1 predicts gpipe and 1f1b, V >= 2 the interleaved schedule on stages x V
  // stages (for each M that is a multiple of `stages`).
  std::vector<int> stages_per_rank{1, 2};
  double link_gbs = 200;     // GB/s of one activation/gradient transfer (fp32 activations)
  int reps = 5;              // timed iterations per round of the layer profile
  double loss_fraction = 1;  // share of positions weighted by the loss (pp_train's data: ~0.09)
  // pp_train --loss-positions: kTargets runs the head at the weighted positions only, kAll at
  // every position (weighting loss_fraction of them).
  model::LossPositions loss_positions = model::LossPositions::kTargets;
  bool zero_bubble = false;  // also predict every pipeline row with split backwards (--zero-bubble)
  // With zero_bubble: the memory allowances to predict, each a pp_train --zb-extra-live (0: the
  // base schedule's memory; zero_bubble.h's kNoLiveLimit: none).
  std::vector<int> zb_extra_live{0};
  // pp_train --recompute: kBlocks adds one forward of its blocks to every backward (predict.h)
  // and keeps only each block's input (memory.h).
  model::Recompute recompute = model::Recompute::kNone;
  // The pipeline's data-parallel replicas D (pp_train --dp) and pp_train --zero (1: AdamW's
  // moments sharded over them); only the memory prediction reads them.
  int replicas = 1;
  int zero = 0;
  // pp_train --cuda-graphs auto: time the layers as CUDA graphs where pp_train would run this plan
  // so (plan_graph_blocker), the way its stages then run; false (--cuda-graphs off): eagerly.
  bool cuda_graphs = true;
  // A stage's work after the schedule (layer_profile.h: StepTailRunner; pp_plan passes the
  // trainer's gradient norm and clip, AdamW and zeroing). Set: it is timed and every prediction
  // ends with it. Empty: the predictions are the schedule's alone. It is timed as a graphed,
  // unsharded stage runs it, .grad zeroed in place. Eager pp_train drops .grad instead, and ZeRO-1
  // steps 1/D of the moments on each replica: those runs' tails are shorter than predicted.
  StepTailRunner step_tail;
  // The tail already timed (measure_plan_tail; `measured` set): the plans use it and do not time
  // step_tail again. It depends on the model, the precision, the kernels and the device only, so
  // plan_hybrid times it once for every D x P split.
  StepTail tail;
  // Told before each micro-batch size is timed (the slow part: minutes for a large model on a
  // CPU): "timing micro-batches of R rows (k of n)". Empty: nothing said.
  std::function<void(const std::string&)> progress;
};

struct PlanRow {
  PartitionKind partition = PartitionKind::kUniform;
  std::string split;     // "0-8|9-13"
  std::string schedule;  // model_parallel (M = 1) | gpipe | 1f1b | interleaved
  int stages_per_rank = 1;
  bool zero_bubble = false;  // pp_train --zero-bubble
  int zb_extra_live = 0;     // pp_train --zb-extra-live (with zero_bubble)
  int microbatches = 1;
  double step_s = 0;
  double speedup = 0;  // over model_parallel on the same split
  // Equal stages, no loss of efficiency: n m V / (m V + n - 1). With zero_bubble the bubble
  // shrinks by the W's, as in Qi et al.'s ZB-H1: n m V / (m V + (n - 1)(1 - 2 w)), w the W share
  // of a block's cost (zero_bubble.h: block_weight_share).
  double ideal = 0;
  double idle = 0;                        // idle fraction of all stages
  std::vector<double> stage_busy_s;       // per rank
  std::vector<double> peak_memory_bytes;  // per rank (memory.h: predict_memory)
  bool peak_memory_measured = false;      // activations from the CUDA allocator, else estimated
};

struct Plan {
  std::map<int64_t, LayerTimes> times;  // micro-batch rows -> measured layer times
  StepTail tail;                        // measured where the spec has a step_tail
  // How the layers were timed: "" as CUDA graphs, else why eagerly (plan_graph_blocker).
  std::string eager_because;
  std::vector<PlanRow> rows;       // partition, then M, then schedule
  std::vector<std::string> notes;  // e.g. why a partition has no rows
};

// Measures (M = 1, the model-parallel baseline, always) and predicts. Throws gpt2p::Error for an M
// that does not divide the batch, a V < 1, more stages than blocks, replicas < 1 or a zero other
// than 0 and 1. A uniform split that leaves a stage empty (e.g. 12 blocks on 8 stages) gives no
// uniform rows and a note, as does a V whose stages x V exceed the blocks. Interleaved rows are
// relative to model parallelism on the partition's split into `stages` stages. Every row's memory
// is predict_memory's for its schedule, from the profile's bytes at its micro-batch size.
Plan make_plan(const model::GPT2Config& config, const PlanSpec& spec, const c10::Device& device);

// The step tail make_plan predicts with: spec.tail where measured, else spec.step_tail timed
// (measure_step_tail at the spec's sequence length, precision, kernels and reps), else none
// (`measured` false).
StepTail measure_plan_tail(const model::GPT2Config& config, const PlanSpec& spec,
                           const c10::Device& device);

// Why make_plan gives no row at all for `spec` (its stages P, stages per rank V and micro-batch
// counts M) on n_layer blocks, or "" when it gives some: make_plan's conditions, checked before
// the layer profile (minutes on a GPU) so that a request with nothing to predict is refused with
// its reason instead of printing an empty table.
std::string why_no_plan(const PlanSpec& spec, int64_t n_layer);

// Why pp_train would launch this plan's stages eagerly instead of as CUDA graphs, in its words
// (both ask graph_blocker in graph_terms.h: --cuda-graphs off, not a GPU, the head at the target
// positions only, --recompute blocks, --zero-bubble, data-parallel replicas), or "" when they would
// run as graphs. make_plan times the layers the same way. With --zero-bubble every row is timed
// eagerly, the unsplit ones included.
std::string plan_graph_blocker(const PlanSpec& spec, const c10::Device& device);
// The terms it asks about (graph_terms.h), as pp_train reads them off the same run's flags.
GraphTerms plan_graph_terms(const PlanSpec& spec, const c10::Device& device);

// {"layer_costs_s_by_rows": {"64": [...], ...}, "stage_overhead_s_by_rows": {"64": s, ...},
// "step_tail": {fixed_s, per_parameter_s} or null (not measured),
// "activation_bytes_by_rows": {"64": {embedding, block, block_recompute, head, stage_input,
// measured}, ...}, "predictions": [{partition, split, schedule, stages_per_rank, zero_bubble,
// zb_extra_live, microbatches, step_s, speedup_vs_model_parallel, ideal_speedup, idle_fraction,
// stage_busy_s, peak_memory_bytes, peak_memory_measured}]}
nlohmann::json to_json(const Plan& plan, int n_layer);

}  // namespace gpt2p::pipeline
