// The weight-gradient half of a split backward, for zero-bubble pipeline schedules
// (pipeline/plan/schedule.h: B computes a stage's input gradient, W its weight gradients later).
//
// deferred_linear(x, weight, bias, store) computes x W^T + b like torch's linear, under autocast
// too (in bf16 when autocast is on for x's device, as autocast's linear does). Its backward
// returns the input and bias gradients at once but leaves the weight's, the other half of the
// backward GEMMs, as (input, output gradient) in `store`. WeightGradStore::run() later adds them
// to weight.grad, in the order backward produced them, so the sum over micro-batches is the one a
// plain backward would accumulate.
//
// The store is filled from autograd's thread and drained from the caller's; close(key) after a
// backward files what it pushed under that key (the micro-batch).
#pragma once

#include <torch/types.h>

#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace gpt2p::model {

class WeightGradStore {
 public:
  // From backward: one linear's deferred weight gradient.
  void push(torch::Tensor input, torch::Tensor grad_output, torch::Tensor weight);
  // Files everything pushed since the last close() under `key`; throws if `key` is pending.
  void close(int key);
  // Adds the weight gradients filed under `key` to their weights' .grad (no autograd) and drops
  // them; throws if nothing is filed under `key`.
  void run(int key);
  // Keys filed and not yet run, plus whether anything is pushed but not filed.
  std::vector<int> pending() const;
  bool has_unfiled() const;

 private:
  struct Entry {
    torch::Tensor input, grad_output, weight;
  };
  mutable std::mutex mutex_;
  std::vector<Entry> open_;
  std::map<int, std::vector<Entry>> filed_;
};

torch::Tensor deferred_linear(const torch::Tensor& x, const torch::Tensor& weight,
                              const torch::Tensor& bias,
                              const std::shared_ptr<WeightGradStore>& store);

}  // namespace gpt2p::model
