#include "gpt2p/compat/adamw.h"

#include <cstdlib>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "gpt2p/compat/version.h"
#include "gpt2p/core/error.h"

namespace gpt2p::compat {

namespace {
// The optimizer state map's key for a parameter: its TensorImpl pointer, or (libtorch < 2.1) that
// pointer as text.
template <class Key>
Key state_key(const torch::Tensor& p) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream os;
    os << p.unsafeGetTensorImpl();
    return os.str();
  } else {
    return p.unsafeGetTensorImpl();
  }
}
using StateKey = std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>::key_type;
}  // namespace

const torch::optim::AdamWParamState* adamw_state(const torch::optim::Optimizer& optimizer,
                                                 const torch::Tensor& p) {
  const auto& state = optimizer.state();
  const auto it = state.find(state_key<StateKey>(p));
  if (it == state.end()) return nullptr;
  return dynamic_cast<const torch::optim::AdamWParamState*>(it->second.get());
}

void set_adamw_state(torch::optim::Optimizer& optimizer, const torch::Tensor& p, int64_t step,
                     torch::Tensor exp_avg, torch::Tensor exp_avg_sq) {
  GPT2P_CHECK(
      exp_avg.sizes() == p.sizes() && exp_avg_sq.sizes() == p.sizes(),
      "AdamW state of shape " << exp_avg.sizes() << " for a parameter of shape " << p.sizes(),
      "this is a bug: the moments must have the parameter's shape");
  auto st = std::make_unique<torch::optim::AdamWParamState>();
  st->step(step);
  st->exp_avg(std::move(exp_avg));
  st->exp_avg_sq(std::move(exp_avg_sq));
  optimizer.state()[state_key<StateKey>(p)] = std::move(st);
}

FusedAdamW::FusedAdamW(std::vector<torch::Tensor> params, torch::optim::AdamWOptions options)
    : torch::optim::AdamW(std::move(params), std::move(options)) {}

torch::Tensor FusedAdamW::step(LossClosure closure) {
  torch::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  static const bool enabled = [] {
    const char* env = std::getenv("GPT2P_FUSED_ADAMW");
    return env == nullptr || std::string(env) != "0";
  }();
  fused_ = enabled && fused_step();
  if (!fused_) torch::optim::AdamW::step();
  return loss;
}

bool FusedAdamW::fused_step() {
#if defined(GPT2P_WITH_CUDA) && GPT2P_TORCH_AT_LEAST(2, 1)
  using Key = typename std::decay_t<decltype(state_)>::key_type;
  auto key_of = [](const torch::Tensor& p) { return state_key<Key>(p); };
  // Check every group first, so that a step is never half fused.
  for (const auto& group : param_groups_) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
    if (o.amsgrad()) return false;
    for (const auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      if (!p.is_cuda() || p.scalar_type() != torch::kFloat32 || p.grad().is_sparse() ||
          p.grad().scalar_type() != p.scalar_type() || p.grad().device() != p.device()) {
        return false;
      }
    }
  }
  torch::NoGradGuard no_grad;
  size_t slot = 0;
  stepped_.clear();
  stepped_slots_.clear();
  for (auto& group : param_groups_) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
    std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs, steps;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      auto it = state_.find(key_of(p));
      if (it == state_.end()) {
        auto st = std::make_unique<torch::optim::AdamWParamState>();
        st->step(0);
        st->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        st->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        it = state_.emplace(key_of(p), std::move(st)).first;
      }
      auto& st = static_cast<torch::optim::AdamWParamState&>(*it->second);
      if (slot >= device_steps_.size()) {
        device_steps_.push_back(torch::empty({}, p.options().dtype(torch::kFloat32)));
        synced_steps_.push_back(-1);
      }
      if (device_steps_[slot].device() != p.device()) {
        device_steps_[slot] =
            torch::full({}, static_cast<float>(st.step()), p.options().dtype(torch::kFloat32));
      } else if (synced_steps_[slot] != st.step()) {
        // In place: a CUDA graph that captured a step keeps reading this tensor's memory.
        device_steps_[slot].fill_(static_cast<double>(st.step()));
      }
      st.step(st.step() + 1);  // the device counts get their +1 below, before the kernel
      synced_steps_[slot] = st.step();
      params.push_back(p);
      grads.push_back(p.grad());
      exp_avgs.push_back(st.exp_avg());
      exp_avg_sqs.push_back(st.exp_avg_sq());
      steps.push_back(device_steps_[slot]);
      stepped_.push_back(p);
      stepped_slots_.push_back(slot);
      ++slot;
    }
    if (params.empty()) continue;
    // As torch.optim's _fused_adamw does: the kernel reads the step count, it does not advance it
    // (a count of 0 would divide by a zero bias correction).
    at::_foreach_add_(steps, 1);
    at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, steps, o.lr(),
                      std::get<0>(o.betas()), std::get<1>(o.betas()), o.weight_decay(), o.eps(),
                      /*amsgrad=*/false, /*maximize=*/false);
  }
  return true;
#else
  return false;
#endif
}

void FusedAdamW::count_replayed_step() {
  GPT2P_CHECK(fused_, "a replayed optimizer step that was not fused",
              "this is a bug: capture only a step that took the fused path");
  using Key = typename std::decay_t<decltype(state_)>::key_type;
  for (size_t i = 0; i < stepped_.size(); ++i) {
    auto it = state_.find(state_key<Key>(stepped_[i]));
    GPT2P_CHECK(it != state_.end(), "a replayed optimizer step over a parameter without state",
                "this is a bug: the captured step created the state");
    auto& st = static_cast<torch::optim::AdamWParamState&>(*it->second);
    st.step(st.step() + 1);
    synced_steps_[stepped_slots_[i]] = st.step();
  }
}

}  // namespace gpt2p::compat
