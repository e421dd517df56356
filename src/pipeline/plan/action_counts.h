// Counting a rank's actions, shared by the simulator and validate() (simulator.h). Internal.
#pragma once

#include <algorithm>

#include "gpt2p/pipeline/plan/schedule.h"

namespace gpt2p::pipeline::detail {

using Op = Action::Op;

// Op values are the op codes of timing files, so they are not contiguous: 6 (the optimizer step
// there) names no action. Tables indexed by op_index keep an unused slot for it.
inline constexpr int kNumOps = static_cast<int>(Op::kWeight) + 1;
inline int op_index(Op op) { return static_cast<int>(op); }

// Whether a rank's list splits its backwards into B and W: then the inputs a B used stay alive
// until the W (which needs them for the weight gradients), so W, not B, frees an activation.
inline bool has_weight_actions(const RankActions& list) {
  return std::any_of(list.begin(), list.end(), [](const Action& a) { return a.op == Op::kWeight; });
}

// Whether a rank's list runs forward only (make_forward_only_schedule): without a B, its F's keep
// nothing alive for one.
inline bool is_forward_only(const RankActions& list) {
  return std::none_of(list.begin(), list.end(),
                      [](const Action& a) { return a.op == Op::kBackward; });
}

// The change of live activations on a rank (see has_weight_actions, is_forward_only) when `a`
// runs.
inline int live_delta(const Action& a, bool split_backward, bool forward_only = false) {
  if (a.op == Op::kForward) return forward_only ? 0 : 1;
  return a.op == (split_backward ? Op::kWeight : Op::kBackward) ? -1 : 0;
}

}  // namespace gpt2p::pipeline::detail
