// Predicted peak memory per pipeline rank: what a rank's stages hold for the whole step (weights,
// gradients, AdamW's moments) plus the activations its schedule keeps alive at its peak.
//
//   peak(r) = sum over r's stages s of params(s) x state_bytes_per_parameter (below: fp32
//             weights, gradients, exp_avg + exp_avg_sq, and the replicas' gradient buckets)
//           + max over r's action list of sum over live (s, mb) of kept(s)
//           + (recompute blocks and r holds a block) one block's kept bytes without recompute
//
// params(s) counts the stage's layers (model/config.h: layer_parameters) and
// the head stage's own copy of the tied wte when it does not hold the embedding. kept(s) is what
// one micro-batch's training forward on stage s keeps for its backward: the sum of its layers'
// bytes (ActivationBytes below; each layer counts its output, which the next layer or the
// executor keeps) and, on a stage after the first, the activation it received. A micro-batch is
// live on a stage from its F until its B (its W when the schedule splits backwards): the
// simulator's count (simulator.h: max_live_activations), weighted by each stage's kept(s), so
// with one stage per rank the middle term is max_live_activations(r) x kept(stage r). The last
// term is the block that backward recomputes, briefly whole again, at the peak.
//
// Left out: backward's and the optimizer step's temporaries, the head's logit chunk
// (lm_head_loss.h), communication and gradient-bucket buffers and the CUDA context, so a real run
// peaks higher. On one H200 (libtorch 2.11), mpirun -np 2 pp_train with GPT-2 124M, bf16, 16 x
// 1024 tokens, 1F1B at M = 8 peaked 8% (rank 0) and 15% (rank 1) above the prediction from the
// measured profile, and 13% and 14% with --recompute blocks. Torch-free.
#pragma once

#include <cstdint>
#include <vector>

#include "gpt2p/model/config.h"
#include "gpt2p/model/options.h"
#include "gpt2p/pipeline/plan/partition.h"
#include "gpt2p/pipeline/plan/schedule.h"

namespace gpt2p::pipeline {

// Bytes one micro-batch's training forward keeps for its backward, per kind of layer, each with
// its output counted and its input not (the previous layer's output, or the stage's input).
struct ActivationBytes {
  double embedding = 0;        // wte + wpe + dropout
  double block = 0;            // one transformer block, --recompute none
  double block_recompute = 0;  // one block under --recompute blocks (its output; its input is kept)
  double head = 0;             // ln_f + LM head + loss (lm_head_loss.h keeps its gradients)
  double stage_input = 0;      // the fp32 activation a stage after the first receives
  // Once per step, not per micro-batch: under bf16 autocast the copies of one block's four weight
  // matrices, which the step casts once and every micro-batch's forward keeps
  // (compat::AutocastCacheScope), 2 x 12 C^2; 0 in fp32.
  double block_weight_copies = 0;
  bool measured = false;  // true: the CUDA allocator's counts; false: the estimate below
};

// The bytes of ActivationBytes from the shapes, for micro-batches of `rows` x `seq_len` tokens,
// in bf16 autocast or fp32, with the head at `loss_fraction` of the positions (at least one per
// row). It counts what the reference path (Kernels::kReference) keeps on a CUDA device with
// libtorch >= 2.0 (fused attention, one-byte dropout masks): what the GPU run would hold, when
// planned on a machine without allocator statistics. Per token, e = 2 (bf16) or 4 bytes, C =
// n_embd, H = n_head, d = 1 when dropout > 0:
//   block: LayerNorm means and inverse deviations 2 x 8; ln_1's output (c_attn's input) C e;
//          q/k/v (c_attn's output, viewed) 3 C e; attention's output C e and its log-sum-exp
//          4 H; that output made contiguous (c_proj's input) C e; the first residual sum (ln_2's
//          input, fp32) 4 C; ln_2's output (c_fc's input) C e; the MLP hidden before GELU
//          (GELU's input) 4 C e and after it (c_proj's input) 4 C e; the residual and MLP
//          dropout masks 2 C d; the block's output (fp32) 4 C. The bf16 copies of its weights
//          are the step's, not the micro-batch's (block_weight_copies).
//   block under recompute: its output, 4 C (its forward ran without grad).
//   embedding: the dropout mask C d and the output 4 C; the positions, 8 bytes each.
//   head: ln_f's means and inverse deviations 8; at each loss position the hidden-state
//         gradient (fp32) 4 C and its index 8; once the weight-sized gradient 4 V' C (V' the
//         padded vocabulary). The logits live only inside the forward.
//   stage input: 4 C.
// 1.13's explicit attention also keeps its probabilities, H x seq_len per token: not counted.
// On one H200 (libtorch 2.11), GPT-2 124M at 2 x 1024 tokens, the block came out 3.5% (bf16)
// and 5% (fp32) above the allocator's count; embedding, head and recompute within 0.5% (when
// both counted the weight copies per micro-batch, before the step cast them once).
ActivationBytes estimate_activation_bytes(const model::GPT2Config& config, int64_t rows,
                                          int64_t seq_len, bool bf16, double loss_fraction);

// How the run keeps its state: pp_train's --recompute and --zero with --dp `replicas`.
struct MemoryModel {
  model::Recompute recompute = model::Recompute::kNone;
  int replicas = 1;    // D: data-parallel replicas of the pipeline
  bool zero1 = false;  // AdamW's moments sharded over the replicas
};

// Bytes per parameter a rank holds for the whole step: 4 (weight) + 4 (gradient) + 8 (moments)
// on one replica; with D > 1 replicas also 4 for the gradient buckets they are summed in; with
// ZeRO-1 the moments are 8 / D, plus 4 / D for the shard's reduced gradient.
double state_bytes_per_parameter(const MemoryModel& model);

// Parameters stage `stage` of the partition holds (with the head stage's own wte, see above).
double stage_parameters(const model::GPT2Config& config, const LayerRange& stage);

// kept(s) above for every stage of the partition.
std::vector<double> stage_activation_bytes(const ActivationBytes& bytes, const Partition& partition,
                                           int n_layer, model::Recompute recompute);

// Per rank, the most activation bytes alive at once as it runs its list of `schedule` (stage s's
// micro-batches weigh stage_bytes[s]; live from F to B, or to W where the rank's list has W's).
std::vector<double> peak_activation_bytes(const Schedule& schedule,
                                          const std::vector<double>& stage_bytes);

// What one rank holds at its peak, and the parts of it.
struct RankMemory {
  double states = 0;         // weights, gradients and moments
  double activations = 0;    // the live micro-batches at the peak
  double recompute = 0;      // the block recomputed at the peak
  double weight_copies = 0;  // the step's bf16 copies of its blocks' weights
  // The first stage's step of token-lookup gradients, M x [rows, T, C] float32 (= M x
  // stage_input), where it sums them once per step (GptStage::sum_lookup_grads_per_step: one
  // replica, M > 1).
  double lookup_grads = 0;
  double total() const { return states + activations + recompute + weight_copies + lookup_grads; }
};

// peak(r) above for every rank of `schedule` (rank r runs stages r, r + R, ...). Throws
// gpt2p::Error when the partition has not R x V stages for the schedule's R ranks, or for
// replicas < 1.
std::vector<RankMemory> predict_memory(const model::GPT2Config& config, const Partition& partition,
                                       const Schedule& schedule, const ActivationBytes& bytes,
                                       const MemoryModel& model);

}  // namespace gpt2p::pipeline
