// Which layers each pipeline stage holds.
//
// Layers are numbered 0..L+1 for a GPT-2 with L transformer blocks:
//   0        token + position embedding (wte, wpe)
//   1..L     transformer block b-1 (h.0 .. h.{L-1})
//   L+1      final layer norm (ln_f) + LM head (tied to wte)
// A partition gives every stage a non-empty, contiguous range [begin, end) of these numbers; the
// ranges are in stage order and cover 0..L+1 exactly.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "gpt2p/core/names.h"
#include "gpt2p/pipeline/plan/layer_range.h"

namespace gpt2p::pipeline {

using Partition = std::vector<LayerRange>;  // one range per stage

// --partition: HW5's uniform split (partition_uniform), the split balanced by a FLOP count of
// each layer (partition_balanced over layer_costs_flops), or balanced by layer times measured on
// the device (pipeline/perf/layer_profile.h).
enum class PartitionKind { kUniform, kBalanced, kMeasured };
constexpr std::array<Named<PartitionKind>, 3> names(PartitionKind) {
  return {{{PartitionKind::kUniform, "uniform"},
           {PartitionKind::kBalanced, "balanced"},
           {PartitionKind::kMeasured, "measured"}}};
}

// HW5's split: ceil(L / n) blocks per stage in order (the last stage gets what is left), the
// embedding on the first stage, ln_f + head on the last. Throws gpt2p::Error when n_stages < 1,
// n_stages > n_blocks, or the split leaves a stage with no layer at all (e.g. 12 blocks on 8
// stages: 2 per stage fill 6 stages); the message names the numbers and the fix.
Partition partition_uniform(int n_blocks, int n_stages);

// Contiguous split of layers 0..size-1 into n_stages non-empty stages minimising the largest
// stage cost (sum of its layers' costs); exact (dynamic programming over prefix sums).
// `layer_costs` are per-layer costs in any unit: layer_costs_flops(), or measured times.
// Ties: among optimal splits the later stages take as many layers as the optimum allows, so the
// earlier stages are the lighter ones (they hold the most live activations under 1F1B). Needs
// layer_costs.size() == L + 2 >= 3 with 1 <= n_stages <= L, every cost finite and >= 0.
Partition partition_balanced(const std::vector<double>& layer_costs, int n_stages);

// The split for R = n_ranks ranks holding V = stages_per_rank stages each (rank r runs stages r,
// r + R, ...; schedule.h's interleaved schedule): contiguous, non-empty stages that minimise the
// largest per-rank sum of stage costs (what bounds the steady state), then the largest stage (what
// the fill and drain wait for), then the sum of squared stage costs (evener stages wait less for
// their neighbours). A depth-first search over the cuts, pruned by the best split so
// far and started from partition_balanced's, which it returns unless it finds a better one; it
// gives up after `max_nodes` visited cuts (ample for GPT-2 sizes) and keeps the best found, so
// every rank computes the same split. V = 1 is partition_balanced. Same requirements on the costs
// and R V as partition_balanced.
Partition partition_interleaved(const std::vector<double>& layer_costs, int n_ranks,
                                int stages_per_rank, long max_nodes = 2000000);

// FLOPs of forward + backward (3 x forward) per layer for one sequence of seq_len tokens:
//   embedding 0 (a gather: memory-bound, no multiply-adds),
//   block     3 * (24 T C^2 + 4 T^2 C)   (QKV/proj/MLP matmuls + attention scores and values),
//   ln_f+head 3 * (2 T C V) * loss_fraction   (the head runs only where the loss counts:
//             model/lm_head_loss.h; loss_fraction = 1 for a head at every position).
// n_head does not change the FLOPs; it is checked to divide n_embd. Returns L + 2 values.
std::vector<double> layer_costs_flops(int n_layer, int n_embd, int n_head, int seq_len,
                                      int vocab_size, double loss_fraction = 1.0);

// Sum of layer costs per stage; throws unless `partition` covers layer_costs exactly.
std::vector<double> stage_costs(const std::vector<double>& layer_costs, const Partition& partition);
double max_stage_cost(const std::vector<double>& layer_costs, const Partition& partition);

// Inclusive ranges per stage, "0-6|7-13".
std::string to_string(const Partition& partition);

}  // namespace gpt2p::pipeline
