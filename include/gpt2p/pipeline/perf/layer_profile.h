// Measured layer costs for `--partition measured`: the time of one forward + backward of a
// micro-batch through the embedding, through one transformer block and through ln_f + head + loss,
// on the device, in the run's precision, with the same GptStage code the executor runs.
//
// The FLOP model (partition.h) counts matmul work only. On a GPU the head's 50k-wide softmax and
// cross-entropy, the embedding's scatter into a 50k x C gradient and the small-matmul efficiency of
// a micro-batch are what decide the split, and only a measurement sees them (on 2xH200, GPT-2
// small at 16 x 128 tokens: the head costs about 4.2 blocks, the FLOP model says 5.3).
//
// GPT-2's blocks are all the same shape, so one block is timed and stands for every block: the
// profile fits in one GPU's memory whatever the depth of the model.
//
// The profile also counts the bytes each part's training forward keeps for its backward
// (memory.h's ActivationBytes), for the planner's peak memory per rank: on CUDA from the caching
// allocator, on the CPU (no allocator statistics) estimated from the shapes.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "gpt2p/model/config.h"
#include "gpt2p/model/options.h"
#include "gpt2p/pipeline/perf/memory.h"

namespace gpt2p::model {
class GPT2;
}

namespace gpt2p::pipeline {

// Seconds for one forward + backward of one micro-batch.
struct LayerTimes {
  double embedding = 0;  // wte + wpe lookup and its gradient
  double block = 0;      // one transformer block
  double head = 0;       // ln_f + LM head + masked cross-entropy
  // What one stage's forward + backward call costs beyond its layers, once per stage whatever it
  // holds: autocast, the autograd engine's start, the input's requires_grad. Where the host is
  // the bottleneck (small micro-batches, bf16) timing each layer alone would count it once per
  // layer. 0 when the model has one block (nothing to tell it apart).
  double stage = 0;
  // Bytes one micro-batch keeps per part (not seconds): measured on CUDA, else estimated.
  ActivationBytes activations;
};

// How measure_layer_times runs the parts: as a stage of pp_train runs them, by default one
// micro-batch of a reference-kernel eager stage with the head at the loss positions.
struct LayerTiming {
  int warmup = 2;  // untimed iterations first
  int reps = 5;    // iterations per timed round
  int rounds = 3;  // the fastest round counts
  // The share of each row's positions whose loss counts (the data's target tokens:
  // TrainData::target_fraction), in (0, 1]; at least one position per row.
  double loss_fraction = 1.0;
  // false: the activation bytes are estimated, not measured (a trainer that needs only times).
  bool measure_memory = true;
  // The path the parts run (resolved: kFused or kReference), as the trainers' --kernels.
  model::Kernels kernels = model::Kernels::kReference;
  // Each part's forward and backward replayed as CUDA graphs, as pp_train --cuda-graphs runs a
  // stage (CUDA only; ignored elsewhere).
  bool graphs = false;
  int microbatches = 1;  // micro-batches per timed step
  // As GptStage's (pp_train --loss-positions): kTargets runs the head at the weighted positions
  // only, kAll at every position with only `loss_fraction` of them weighted, as pp_train runs
  // HW5's padded pairs (the cross-entropy kernel skips rows of weight 0).
  model::LossPositions positions = model::LossPositions::kTargets;
};

// Builds each part alone (random weights, random tokens), runs `timing.warmup` untimed iterations,
// then `rounds` rounds of `reps` iterations and keeps the fastest round's mean per micro-batch
// (the least disturbed); synchronises the device around each round. Each iteration is one step of
// a stage that holds the part and runs `microbatches` micro-batches of `micro_rows` rows, as
// pp_train runs it on one rank: the work a step does once (setting the batch, casting the weights
// to the autocast type) is shared by its micro-batches, as in training. So every M costs about
// one whole batch's forward + backward per timed step, whatever the micro-batch size. `stage` is
// one block's time alone minus the marginal block of a chain of min(4, n_layer) blocks, at most the
// cheapest part's time alone (each part alone paid it once); every part is given without it, so the
// embedding can come out 0 (it costs no more than the call). The head runs at
// model::head_row_share of each row's positions, at least one. Throws on micro_rows, seq_len, reps,
// rounds or microbatches < 1, warmup < 0, and on a loss fraction outside (0, 1].
//
// On CUDA, `activations` are what the allocator holds after one more forward of each part alone
// (grad on, after the timed iterations, so the gradients exist already, inside the step's weight
// casts) minus what it held before, the part's output included and its input not; the block is
// counted once as it runs and once built with Recompute::kBlocks. The stage input is its shape in
// fp32. Elsewhere, or without measure_memory, they are estimate_activation_bytes's.
//
// With `graphs`, each part runs after at least StageGraphs::kWarmupSteps + 1 untimed iterations
// (the eager ones and the capture). Where the host launches kernels more slowly than the GPU runs
// them (small micro-batches), eager times are the host's: timing each part alone then adds up the
// host's time per part, which a graphed stage does not pay. The activation bytes are measured
// eagerly, before the graphs (a graph's memory is its pool's, taken once at capture).
LayerTimes measure_layer_times(const model::GPT2Config& config, int64_t micro_rows, int64_t seq_len,
                               c10::ScalarType autocast, const c10::Device& device,
                               const LayerTiming& timing = {});

// A stage's work after the schedule, once per step: `fixed` + `per_parameter` x the parameters it
// holds (memory.h: stage_parameters). Its gradient norm, AdamW and the zeroing of .grad read and
// write every parameter's state; the fixed part is their launches and the norm's read back.
struct StepTail {
  double fixed = 0;
  double per_parameter = 0;
  bool measured = false;  // false: not measured, the predictions leave the tail out
};

// Given a part of the model whose .grad exist, the closure that runs that work on it once (the
// trainer's own code: pp_plan passes it, this layer does not know the trainer).
using StepTailRunner = std::function<std::function<void()>(model::GPT2&)>;

// Times `runner`'s work on one block and on a chain of min(4, n_layer) blocks, each built alone
// (one row of seq_len tokens, one forward + backward to make the gradients), as
// measure_layer_times times its parts (the fastest of `rounds` rounds of `reps`), and fits the
// line through the two (fit_step_tail). Before each run the gradients are made non-zero again
// (what a backward leaves for the work to read and clip); that refill is timed alone and taken
// off.
StepTail measure_step_tail(const model::GPT2Config& config, int64_t seq_len,
                           c10::ScalarType autocast, const c10::Device& device,
                           model::Kernels kernels, const StepTailRunner& runner, int reps = 5,
                           int rounds = 3);

// The line through (params_one, seconds_one) and (params_chain, seconds_chain). Where there is no
// chain (params_chain <= params_one), or noise tips the line's fixed part below zero or its slope
// to zero or below, the fixed part is 0 and the cost per parameter is the larger part's mean.
StepTail fit_step_tail(double params_one, double seconds_one, double params_chain,
                       double seconds_chain);
// Per-layer costs in partition.h's numbering: [embedding, block x n_layer, head].
std::vector<double> layer_costs_from_times(const LayerTimes& times, int n_layer);

}  // namespace gpt2p::pipeline
