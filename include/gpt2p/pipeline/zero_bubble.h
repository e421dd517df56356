// Zero-bubble schedules for GPT-2 stages: the costs schedule.h's zero_bubble_schedule places the
// W actions by, from GPT-2's FLOPs, and the full schedule an executor runs.
//
// Per sequence of T tokens and width C, a transformer block's forward is 24 T C^2 (the four
// linear layers) + 4 T^2 C (attention). Its backward is twice that: the input gradient (B) is
// 24 T C^2 + 8 T^2 C and the weight gradients (W) are the linear layers' other 24 T C^2. The head
// (model/lm_head_loss.h) computes all its gradients during its forward: 3 x 2 T C V x the loss
// fraction in F, nothing left for B or W. The embedding costs nothing in this count (a gather).
#pragma once

#include "gpt2p/pipeline/partition.h"
#include "gpt2p/pipeline/schedule.h"

namespace gpt2p::pipeline {

// Per-stage forward / input-backward / weight-backward FLOPs of one sequence for `split` (stages
// in order) of a GPT-2 with n_layer blocks. Throws gpt2p::Error for a split that does not cover
// the n_layer + 2 layers, or the parameter errors of layer_costs_flops.
ZeroBubbleCosts zero_bubble_costs(const Partition& split, int n_layer, int n_embd, int seq_len,
                                  int vocab_size, double loss_fraction);

// The W part of a block's forward + backward cost: 24 T C^2 / (3 (24 T C^2 + 4 T^2 C)), about 0.32
// at T = 128, C = 768 and 0.27 at T = 1024.
double block_weight_share(int n_embd, int seq_len);

// make_schedule(kind, ...) with every backward split and its W's placed by zero_bubble_schedule
// at `costs` (one entry per stage of n_ranks x stages_per_rank), communication added.
Schedule make_zero_bubble_schedule(ScheduleKind kind, int n_microbatches, int n_ranks,
                                   int stages_per_rank, const ZeroBubbleCosts& costs);

}  // namespace gpt2p::pipeline
