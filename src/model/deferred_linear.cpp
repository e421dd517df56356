#include "gpt2p/model/deferred_linear.h"

#include <torch/torch.h>

#include "gpt2p/compat/device.h"
#include "gpt2p/core/error.h"

namespace gpt2p::model {

void WeightGradStore::push(torch::Tensor input, torch::Tensor grad_output, torch::Tensor weight) {
  std::lock_guard<std::mutex> lock(mutex_);
  open_.push_back({std::move(input), std::move(grad_output), std::move(weight)});
}

void WeightGradStore::close(int key) {
  std::lock_guard<std::mutex> lock(mutex_);
  GPT2P_CHECK(filed_.count(key) == 0,
              "deferred weight gradients of micro-batch " << key << " are filed twice",
              "run each micro-batch's W before its next backward");
  filed_[key] = std::move(open_);
  open_.clear();
}

void WeightGradStore::run(int key) {
  std::vector<Entry> entries;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = filed_.find(key);
    GPT2P_CHECK(it != filed_.end(), "no deferred weight gradients for micro-batch " << key,
                "a W action must follow the B of the same micro-batch and stage");
    entries = std::move(it->second);
    filed_.erase(it);
  }
  torch::NoGradGuard no_grad;
  for (auto& e : entries) {
    const auto dy = e.grad_output.reshape({-1, e.grad_output.size(-1)});
    const auto x = e.input.reshape({-1, e.input.size(-1)});
    auto g = dy.t().mm(x);  // [out, in], in the forward's compute dtype
    auto& acc = e.weight.mutable_grad();
    if (!acc.defined()) {
      acc = g.to(e.weight.scalar_type());
    } else {
      acc.add_(g);
    }
  }
}

std::vector<int> WeightGradStore::pending() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<int> keys;
  for (const auto& kv : filed_) keys.push_back(kv.first);
  return keys;
}

bool WeightGradStore::has_unfiled() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !open_.empty();
}

namespace {

// saved_data holds IValues; a capsule carries the store.
struct StoreHolder : torch::CustomClassHolder {
  explicit StoreHolder(std::shared_ptr<WeightGradStore> s) : store(std::move(s)) {}
  std::shared_ptr<WeightGradStore> store;
};

class DeferredLinear : public torch::autograd::Function<DeferredLinear> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const torch::Tensor& bias,
                               const std::shared_ptr<WeightGradStore>& store) {
    // Autocast would cast the operands of a linear to its type (bf16 or fp16); do it here, so
    // backward (which runs outside autocast) sees the same operands.
    const auto dtype = compat::autocast_dtype(x.device(), weight.scalar_type());
    const auto xc = x.to(dtype);
    const auto wc = weight.to(dtype);
    const auto bc = bias.defined() ? bias.to(dtype) : bias;
    ctx->save_for_backward({xc, wc, weight});
    ctx->saved_data["store"] = c10::IValue::make_capsule(c10::make_intrusive<StoreHolder>(store));
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["has_bias"] = bias.defined();
    return torch::linear(xc, wc, bc);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& xc = saved[0];
    const auto& wc = saved[1];
    const auto& weight = saved[2];
    const auto dy = grads[0].to(wc.scalar_type());
    const auto x_dtype = static_cast<torch::ScalarType>(ctx->saved_data["x_dtype"].toInt());
    auto dx = dy.matmul(wc).to(x_dtype);
    torch::Tensor db;
    if (ctx->saved_data["has_bias"].toBool()) {
      db = dy.reshape({-1, dy.size(-1)}).sum(0).to(weight.scalar_type());
    }
    const auto capsule = ctx->saved_data["store"].toCapsule();
    const auto* holder = dynamic_cast<const StoreHolder*>(capsule.get());
    GPT2P_CHECK(holder != nullptr, "deferred linear lost its weight-gradient store",
                "this is a bug");
    holder->store->push(xc, dy, weight);
    return {dx, torch::Tensor(), db, torch::Tensor()};  // one per argument; the weight's comes in W
  }
};

}  // namespace

torch::Tensor deferred_linear(const torch::Tensor& x, const torch::Tensor& weight,
                              const torch::Tensor& bias,
                              const std::shared_ptr<WeightGradStore>& store) {
  GPT2P_CHECK(store != nullptr, "deferred_linear without a weight-gradient store",
              "use torch::linear when the weight gradient is not deferred");
  return DeferredLinear::apply(x, weight, bias, store);
}

}  // namespace gpt2p::model
