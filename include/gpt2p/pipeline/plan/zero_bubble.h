// Zero-bubble schedules: the greedy placement of W actions, its costs for GPT-2 stages from GPT-2's
// FLOPs, and the full schedule an executor runs.
//
// Per sequence of T tokens and width C, a transformer block's forward is 24 T C^2 (the four
// linear layers) + 4 T^2 C (attention). Its backward is twice that: the input gradient (B) is
// 24 T C^2 + 8 T^2 C and the weight gradients (W) are the linear layers' other 24 T C^2. The head
// (model/lm_head_loss.h) computes all its gradients during its forward: 3 x 2 T C V x the loss
// fraction in F, nothing left for B or W. The embedding costs nothing in this count (a gather).
#pragma once

#include "gpt2p/pipeline/plan/partition.h"
#include "gpt2p/pipeline/plan/schedule.h"

namespace gpt2p::pipeline {

// Zero-bubble scheduling (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024): every
// backward is split into B (the gradient of the stage's input, which the previous stage waits for)
// and W (the gradients of the stage's weights, which nobody waits for). B runs where the base
// schedule put the backward; each W is deferred into the gaps where the rank would otherwise wait
// for a transfer, and the rest run after the rank's last B.
//
// Costs per stage, in any time unit: forward, input_backward (B) and weight_backward (W) of one
// micro-batch; comm is added to every transfer.
struct ZeroBubbleCosts {
  std::vector<double> forward;
  std::vector<double> input_backward;
  std::vector<double> weight_backward;
  double comm = 0.0;
};

// `base`: a compute-only schedule (F and B actions, as from gpipe/1f1b/interleaved_schedule) of
// n = costs.forward.size() stages on R = base.size() ranks. Returns it with one W per B, placed
// by a greedy list scheduler that walks time forward over all ranks at once:
//  * a rank runs its base actions in their order; F of stage s > 0 needs F of stage s - 1 (same
//    micro-batch) finished plus comm, B of stage s < n - 1 needs B of stage s + 1 finished plus
//    comm, B needs its own F; W needs its own B;
//  * when a rank's next base action cannot start yet (its input is not ready, or comes from an
//    action not yet placed), and the rank has deferred W's, it runs the oldest one now if the wait
//    is at least half that W's cost (an unknown wait counts as long enough);
//  * after its last base action a rank runs its remaining W's, oldest first;
//  * memory: a deferred W keeps its micro-batch's layer inputs and output gradients alive. No
//    rank holds more micro-batches between their F and their W than the unsplit base's busiest
//    rank holds between F and B (1F1B: the first, with n), plus extra_live; when an F would pass
//    that, the oldest W runs first. extra_live = 0 (the default) keeps the base's peak memory,
//    as Qi et al.'s ZB-H1 keeps 1F1B's: one stage then defers nothing. kNoLiveLimit lets every
//    W wait as long as it helps (on one stage, all go to the end).
// The result is static (a plain schedule): the executor runs it as any other. Throws gpt2p::Error
// for costs that do not match the stages, negative or non-finite costs, W actions already in
// `base`, or a base schedule whose dependencies can never be met.
constexpr int kNoLiveLimit = -1;
Schedule zero_bubble_schedule(const Schedule& base, const ZeroBubbleCosts& costs,
                              int extra_live = 0);

// Per rank: the most micro-batches (summed over its stages) the schedule holds alive at once,
// from their F to their W, or to their B where it has no W's.
std::vector<int> peak_live(const Schedule& schedule);

// Per-stage forward / input-backward / weight-backward FLOPs of one sequence for `split` (stages
// in order) of a GPT-2 with n_layer blocks. Throws gpt2p::Error for a split that does not cover
// the n_layer + 2 layers, or the parameter errors of layer_costs_flops.
ZeroBubbleCosts zero_bubble_costs(const Partition& split, int n_layer, int n_embd, int seq_len,
                                  int vocab_size, double loss_fraction);

// The W part of a block's forward + backward cost: 24 T C^2 / (3 (24 T C^2 + 4 T^2 C)), about 0.32
// at T = 128, C = 768 and 0.27 at T = 1024.
double block_weight_share(int n_embd, int seq_len);

// make_schedule(kind, ...) with every backward split and its W's placed by zero_bubble_schedule
// at `costs` (one entry per stage of n_ranks x stages_per_rank) and `extra_live`, communication
// added.
Schedule make_zero_bubble_schedule(ScheduleKind kind, int n_microbatches, int n_ranks,
                                   int stages_per_rank, const ZeroBubbleCosts& costs,
                                   int extra_live = 0);

}  // namespace gpt2p::pipeline
