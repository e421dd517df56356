#include "gpt2p/parallel/train/loss_scaler.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <string>

#include "gpt2p/comm/communicator.h"
#include "gpt2p/core/error.h"

namespace gpt2p::parallel {

LossScaler::LossScaler(const LossScaleOptions& options, const LossScaleState& resumed)
    : enabled_(options.mode == LossScaleMode::kDynamic), window_(options.window) {
  GPT2P_CHECK(options.mode != LossScaleMode::kAuto, "LossScaler: --loss-scale auto is not resolved",
              "resolve the options (resolve_train_config) before building the scaler");
  if (const char* env = std::getenv("GPT2P_INJECT_NONFINITE_GRADS"); env != nullptr) {
    std::stringstream list(env);
    std::string item;
    while (std::getline(list, item, ',')) {
      int rank = -1;
      long long step = -1;
      char colon = 0;
      std::istringstream one(item);
      GPT2P_CHECK(
          (one >> rank >> colon >> step) && colon == ':' && one.eof() && rank >= 0 && step >= 0,
          "GPT2P_INJECT_NONFINITE_GRADS=" << env << ": \"" << item << "\" is not RANK:STEP",
          "list RANK:STEP pairs separated by commas, e.g. 1:3,0:5, or unset it");
      faults_.emplace_back(rank, static_cast<int64_t>(step));
    }
  }
  if (!enabled_) return;
  if (resumed.scale > 0) {
    state_ = resumed;
  } else {
    state_.scale = options.init;
  }
}

bool LossScaler::update(bool finite, comm::Communicator* control, int64_t step) {
  if (!enabled_) return true;
  if (control != nullptr && control->size() > 1) {
    // Any rank's overflow skips the step on every rank: the replicas must step together.
    auto flag = torch::tensor({finite ? 0 : 1}, torch::kInt32);
    control->all_reduce(flag, comm::ReduceOp::kSum);
    finite = flag.item<int>() == 0;
  }
  if (finite) {
    if (++state_.good_steps >= window_) {
      state_.scale = std::min(state_.scale * growth_, kMaxLossScale);
      state_.good_steps = 0;
    }
    return true;
  }
  state_.scale *= backoff_;
  state_.good_steps = 0;
  ++state_.skipped_steps;
  GPT2P_CHECK(state_.scale >= kMinLossScale,
              "the gradients are not finite even at loss scale "
                  << state_.scale / backoff_ << " (step " << step << ", " << state_.skipped_steps
                  << " steps skipped in this run): the training has diverged",
              "lower --lr, or resume from an earlier checkpoint; --precision bf16 or fp32 where "
              "the GPU has them");
  return false;
}

bool LossScaler::injects_fault(int rank, int64_t step) const {
  return std::find(faults_.begin(), faults_.end(), std::make_pair(rank, step)) != faults_.end();
}

LossScaleState LossScaler::state() const { return enabled_ ? state_ : LossScaleState{}; }

}  // namespace gpt2p::parallel
