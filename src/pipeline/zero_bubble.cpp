#include "gpt2p/pipeline/zero_bubble.h"

#include "gpt2p/core/error.h"

namespace gpt2p::pipeline {

ZeroBubbleCosts zero_bubble_costs(const Partition& split, int n_layer, int n_embd, int seq_len,
                                  int vocab_size, double loss_fraction) {
  GPT2P_CHECK(n_layer >= 1 && n_embd >= 1 && seq_len >= 1 && vocab_size >= 1,
              "zero_bubble_costs: n_layer " << n_layer << ", n_embd " << n_embd << ", seq_len "
                                            << seq_len << ", vocab_size " << vocab_size
                                            << ": all must be >= 1",
              "pass the model config");
  GPT2P_CHECK(loss_fraction > 0 && loss_fraction <= 1,
              "zero_bubble_costs: loss fraction " << loss_fraction << " is not in (0, 1]",
              "pass the share of positions whose loss counts (1: every position)");
  const double t = seq_len, c = n_embd, v = vocab_size;
  const double linear = 24 * t * c * c, attention = 4 * t * t * c;
  ZeroBubbleCosts costs;
  int next = 0;
  for (const auto& stage : split) {
    GPT2P_CHECK(stage.begin == next && stage.end > stage.begin && stage.end <= n_layer + 2,
                "zero_bubble_costs: stage [" << stage.begin << ", " << stage.end
                                             << ") does not continue the split at layer " << next,
                "pass contiguous, non-empty stages covering layers 0.." << n_layer + 1);
    double f = 0, b = 0, w = 0;
    for (int layer = stage.begin; layer < stage.end; ++layer) {
      if (layer >= 1 && layer <= n_layer) {
        f += linear + attention;
        b += linear + 2 * attention;
        w += linear;
      } else if (layer == n_layer + 1) {
        f += 3 * 2 * t * c * v * loss_fraction;
      }
    }
    costs.forward.push_back(f);
    costs.input_backward.push_back(b);
    costs.weight_backward.push_back(w);
    next = stage.end;
  }
  GPT2P_CHECK(next == n_layer + 2,
              "zero_bubble_costs: the split ends at layer " << next << " of " << n_layer + 2,
              "pass stages covering layers 0.." << n_layer + 1);
  return costs;
}

double block_weight_share(int n_embd, int seq_len) {
  GPT2P_CHECK(n_embd >= 1 && seq_len >= 1,
              "block_weight_share: n_embd " << n_embd << ", seq_len " << seq_len,
              "pass the model width and sequence length (>= 1)");
  const double linear = 24.0 * n_embd, attention = 4.0 * seq_len;  // per T C
  return linear / (3 * (linear + attention));
}

Schedule make_zero_bubble_schedule(ScheduleKind kind, int n_microbatches, int n_ranks,
                                   int stages_per_rank, const ZeroBubbleCosts& costs) {
  const int n_stages = n_ranks * stages_per_rank;
  Schedule base;
  switch (kind) {
    case ScheduleKind::kGPipe:
      base = gpipe_schedule(n_microbatches, n_stages);
      break;
    case ScheduleKind::kOneFOneB:
      base = one_f_one_b_schedule(n_microbatches, n_stages);
      break;
    case ScheduleKind::kInterleaved:
      base = interleaved_schedule(n_microbatches, n_ranks, stages_per_rank);
      break;
  }
  GPT2P_CHECK(kind == ScheduleKind::kInterleaved || stages_per_rank == 1,
              to_string(kind) << " runs one stage per rank, not " << stages_per_rank,
              "use --schedule interleaved for several stages per rank");
  return add_communication(zero_bubble_schedule(base, costs), n_stages);
}

}  // namespace gpt2p::pipeline
