// Dynamic loss scaling (--loss-scale; on by default with --precision fp16).
//
// float16 keeps about 5 significant decimal digits over 6e-8 .. 65504: small gradients of GPT-2
// would round to zero. The trainers therefore multiply the loss by a scale S (the weights of its
// rows: model::LossRows), so every gradient of backward comes out S times too large, and divide
// it out again when clipping (grad_norm.h: inv_scale). A scale too large overflows some gradient
// to inf or NaN; the global gradient norm then is not finite. Each step:
//   - a finite norm (on every rank: the ranks agree through the host's control communicator) lets
//     the optimizer step run; after `window` such steps in a row S grows by `growth`;
//   - otherwise the step is skipped (no optimizer update, the weights and the AdamW state stay as
//     they were), S shrinks by `backoff` and the count starts again.
// S stays a power of two when it starts as one (the defaults), so the scaling itself is exact:
// with float32 and no overflow a scaled run computes the same bits as an unscaled one (the MPI
// tests check it). The scale, the good steps since the last change and the skipped steps are
// saved in the checkpoint (model::TrainState) and recorded per step (io/run_record.h).
#pragma once

#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include "gpt2p/core/names.h"

namespace gpt2p::comm {
class Communicator;
}

namespace gpt2p::parallel {

// --loss-scale: kAuto is dynamic with --precision fp16, off otherwise (resolve_train_config
// decides it once; the scaler sees kDynamic or kOff).
enum class LossScaleMode { kAuto, kDynamic, kOff };
constexpr std::array<Named<LossScaleMode>, 3> names(LossScaleMode) {
  return {{{LossScaleMode::kAuto, "auto"},
           {LossScaleMode::kDynamic, "dynamic"},
           {LossScaleMode::kOff, "off"}}};
}

struct LossScaleOptions {
  LossScaleMode mode = LossScaleMode::kAuto;
  double init = 65536;    // 2^16, as torch.amp.GradScaler
  int64_t window = 2000;  // good steps in a row before the scale doubles
};

// The largest scale: float16's range ends at 65504, so a larger scale only overflows; the cap
// also keeps a long run of good steps from growing S without bound.
inline constexpr double kMaxLossScale = 16777216.0;  // 2^24
// Below this the gradients are not finite even unscaled: the run has diverged.
inline constexpr double kMinLossScale = 1.0 / 1024.0;

struct LossScaleState {
  double scale = 0;           // 0: no scaling saved
  int64_t good_steps = 0;     // finite steps since the scale last changed
  int64_t skipped_steps = 0;  // steps skipped over the whole run
};

class LossScaler {
 public:
  // From the run's resolved options (--loss-scale, --loss-scale-init, --loss-scale-window; mode
  // kAuto is refused: resolve it first) and, on a resume, the checkpoint's state (scale 0: none
  // saved, start at the options' init).
  LossScaler(const LossScaleOptions& options, const LossScaleState& resumed);

  bool enabled() const { return enabled_; }
  // The factor this step's loss is multiplied by: 1 when scaling is off.
  double scale() const { return enabled_ ? state_.scale : 1.0; }

  // After the step's gradients are complete: `finite` is whether this rank's global gradient norm
  // is finite. Agrees over `control` (every rank calls, in step; null or one rank: no agreement),
  // updates the scale and returns whether the optimizer step runs. Throws when the scale falls
  // below kMinLossScale. Scaling off: returns true without a word to the other ranks.
  bool update(bool finite, comm::Communicator* control, int64_t step);

  // What a checkpoint saves (scale 0 when off).
  LossScaleState state() const;

  // Fault injection for the tests: whether rank `rank` is to make its gradients of step `step`
  // non-finite (after they are summed, before the norm), as an overflow would. The steps come
  // from the environment: GPT2P_INJECT_NONFINITE_GRADS="RANK:STEP[,RANK:STEP...]" (world ranks;
  // read once, by the constructor, which refuses a malformed value).
  bool injects_fault(int rank, int64_t step) const;
  // Whether any fault is to be injected.
  bool injects_faults() const { return !faults_.empty(); }

 private:
  bool enabled_ = false;
  double growth_ = 2.0, backoff_ = 0.5;
  int64_t window_ = 2000;
  LossScaleState state_;
  std::vector<std::pair<int, int64_t>> faults_;
};

}  // namespace gpt2p::parallel
