#include "gpt2p/pipeline/perf/layer_profile.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <limits>
#include <memory>
#include <optional>

#include "gpt2p/compat/cuda_graph.h"
#include "gpt2p/compat/device.h"
#include "gpt2p/core/error.h"
#include "gpt2p/model/gpt2.h"
#include "gpt2p/pipeline/runtime/stage.h"

namespace gpt2p::pipeline {
namespace {

// One part of the model alone on `device` (random weights and tokens), run as a stage of
// `microbatches` micro-batches runs a step in pp_train on one rank: the batch set, then each
// micro-batch's forward and its backward with the output's gradient (the loss's own on the last
// stage), the weights cast once for all of them (compat::AutocastCacheScope, as the trainer casts
// them). A received activation requires grad, as in the executor. After use_graphs() each
// micro-batch's forward and backward replay as graphs, as a graphed stage runs them.
class Part {
 public:
  Part(const model::GPT2Config& config, model::LayerRange range, int64_t rows, int64_t seq_len,
       torch::ScalarType autocast, const torch::Device& device, double loss_fraction,
       model::Kernels kernels, model::Recompute recompute = model::Recompute::kNone,
       int microbatches = 1, model::LossPositions positions = model::LossPositions::kTargets)
      : layers_(config, range),
        stage_(init(layers_, device, kernels, recompute), microbatches, autocast, positions),
        microbatches_(microbatches) {
    stage_.sum_lookup_grads_per_step();  // as pp_train's stages of one replica
    const auto ids = torch::TensorOptions().dtype(torch::kInt64).device(device);
    const int64_t batch_rows = rows * microbatches;
    StageBatch batch;
    batch.inputs = torch::randint(config.vocab_size, {batch_rows, seq_len}, ids);
    batch.labels = torch::randint(config.vocab_size, {batch_rows, seq_len}, ids);
    // The first `counted` positions of each row count, as the target span of a translation pair.
    const auto counted = std::clamp<int64_t>(
        static_cast<int64_t>(std::llround(loss_fraction * static_cast<double>(seq_len))), 1,
        seq_len);
    batch.host_mask = torch::zeros({batch_rows, seq_len});
    batch.host_mask.narrow(1, 0, counted).fill_(1.0);
    batch.mask = batch.host_mask.to(device);
    batch.global_target_tokens = batch_rows * counted;
    batch_ = batch;
    stage_.set_batch(batch);
    // Every micro-batch receives the same activation (its values do not change the time).
    if (!stage_.is_first())
      hidden_ = torch::randn({rows, seq_len, config.n_embd}, ids.dtype(torch::kFloat32));
  }

  int microbatches() const { return microbatches_; }
  torch::Tensor forward(int mb = 0) {
    return stage_.forward(
        mb, stage_.is_first() ? stage_.input(mb) : hidden_.detach().requires_grad_(true));
  }
  void backward(const torch::Tensor& out, int mb = 0) {
    stage_.backward(mb, out, stage_.is_last() ? torch::Tensor() : torch::ones_like(out));
  }
  // One step: the batch, then each micro-batch's forward and backward.
  void iteration() {
    stage_.set_batch(batch_);
    const compat::AutocastCacheScope casts;
    for (int mb = 0; mb < microbatches_; ++mb) backward(forward(mb), mb);
  }
  model::GPT2& layers() { return layers_; }
  void use_graphs() { stage_.use_graphs(std::make_shared<compat::GraphPool>()); }

 private:
  static model::GPT2 init(model::GPT2 layers, const torch::Device& device, model::Kernels kernels,
                          model::Recompute recompute) {
    layers->reset_parameters(/*seed=*/1);
    layers->to(device);
    layers->train();
    layers->set_kernels(kernels);
    layers->set_recompute(recompute);
    return layers;
  }

  model::GPT2 layers_;
  GptStage stage_;
  int microbatches_ = 1;
  StageBatch batch_;
  torch::Tensor hidden_;
};

// Fastest round's seconds per call of `work`.
double time_work(const std::function<void()>& work, const torch::Device& device, int warmup,
                 int reps, int rounds) {
  for (int i = 0; i < warmup; ++i) work();
  double best = std::numeric_limits<double>::infinity();
  for (int r = 0; r < rounds; ++r) {
    compat::synchronize(device);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) work();
    compat::synchronize(device);
    const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
    best = std::min(best, dt.count() / reps);
  }
  return best;
}

// Fastest round's seconds per micro-batch's forward + backward of `part` (its steps' mean).
double time_part(Part& part, const torch::Device& device, int warmup, int reps, int rounds) {
  return time_work([&part] { part.iteration(); }, device, warmup, reps, rounds) /
         static_cast<double>(part.microbatches());
}

// What the allocator holds on `device` now. compat has no query of the current allocation, but
// resetting the peak sets it to what is allocated, so the peak right after a reset is the current
// count.
double allocated_bytes(const torch::Device& device) {
  compat::reset_peak_memory(device);
  return static_cast<double>(compat::peak_memory_bytes(device));
}

// Bytes one forward of `part` leaves allocated until its backward, its output included (CUDA).
// Inside one step's weight casts, as training runs it: a first forward + backward makes the
// gradients (no activations) and the bf16 copies of the weights, which the step keeps once
// whatever its micro-batches (ActivationBytes::block_weight_copies), so the forward measured
// after it counts its own bytes.
double kept_bytes(Part& part, const torch::Device& device) {
  const compat::AutocastCacheScope casts;
  part.backward(part.forward());
  const double before = allocated_bytes(device);
  const torch::Tensor out = part.forward();
  const double kept = allocated_bytes(device) - before;
  part.backward(out);
  return std::max(0.0, kept);
}

}  // namespace

LayerTimes measure_layer_times(const model::GPT2Config& config, int64_t micro_rows, int64_t seq_len,
                               torch::ScalarType autocast, const c10::Device& device,
                               const LayerTiming& timing) {
  const int warmup = timing.warmup, reps = timing.reps, rounds = timing.rounds,
            microbatches = timing.microbatches;
  const double loss_fraction = timing.loss_fraction;
  GPT2P_CHECK(micro_rows >= 1 && seq_len >= 1 && reps >= 1 && rounds >= 1 && warmup >= 0 &&
                  microbatches >= 1,
              "measure_layer_times: micro_rows "
                  << micro_rows << ", seq_len " << seq_len << ", reps " << reps << ", rounds "
                  << rounds << ", warmup " << warmup << ", microbatches " << microbatches,
              "pass at least one row, one token, one rep, one round and one micro-batch "
              "(warmup >= 0)");
  GPT2P_CHECK(loss_fraction > 0 && loss_fraction <= 1,
              "measure_layer_times: loss fraction " << loss_fraction << " is not in (0, 1]",
              "pass the share of positions whose loss counts, e.g. 0.094 for HW5's data");
  const int L = static_cast<int>(config.n_layer);
  // The CPU has no allocator statistics.
  const bool count = timing.measure_memory && device.is_cuda();
  ActivationBytes kept =
      estimate_activation_bytes(config, micro_rows, seq_len, autocast != torch::kFloat32,
                                model::head_row_share(timing.positions, loss_fraction));
  const bool graphed = timing.graphs && device.is_cuda() && compat::cuda_graphs_built();
  std::optional<compat::TrainingStream> stream;  // a capture needs a stream other than the default
  if (graphed) stream.emplace(device);
  const auto time = [&](int begin, int end, double* bytes = nullptr) {
    Part part(config, {begin, end}, micro_rows, seq_len, autocast, device, loss_fraction,
              timing.kernels, model::Recompute::kNone, microbatches, timing.positions);
    if (graphed) {
      // The bytes eagerly (kept_bytes' first backward makes the gradients); then the graphs.
      if (count && bytes != nullptr) *bytes = kept_bytes(part, device);
      part.use_graphs();
      return time_part(part, device, std::max(warmup, StageGraphs::kWarmupSteps + 1), reps, rounds);
    }
    const double seconds = time_part(part, device, warmup, reps, rounds);
    if (count && bytes != nullptr) *bytes = kept_bytes(part, device);
    return seconds;
  };
  const double one = time(1, 2, &kept.block), embedding = time(0, 1, &kept.embedding),
               head = time(L + 1, L + 2, &kept.head);
  if (count) {
    Part part(config, {1, 2}, micro_rows, seq_len, autocast, device, loss_fraction, timing.kernels,
              model::Recompute::kBlocks);
    kept.block_recompute = kept_bytes(part, device);
    kept.measured = true;
  }
  double stage = 0.0;
  const int k = std::min(4, L);
  if (k > 1) {
    // Marginal block: a chain of k blocks minus one block alone, per added block. Where timing
    // noise puts the chain below one block, its mean stands for the block.
    const double chain = time(1, 1 + k);
    double marginal = (chain - one) / static_cast<double>(k - 1);
    if (marginal <= 0.0) marginal = chain / static_cast<double>(k);
    // Every part timed alone paid the overhead once, so it cannot exceed the cheapest of them.
    stage = std::max(0.0, std::min({one - marginal, embedding, head}));
  }
  LayerTimes t;
  t.stage = stage;
  t.block = one - stage;
  t.embedding = embedding - stage;
  t.head = head - stage;
  t.activations = kept;
  return t;
}

StepTail fit_step_tail(double params_one, double seconds_one, double params_chain,
                       double seconds_chain) {
  GPT2P_CHECK(params_one > 0 && seconds_one >= 0 && seconds_chain >= 0,
              "fit_step_tail: " << params_one << " parameters in " << seconds_one << " s, "
                                << params_chain << " in " << seconds_chain << " s",
              "pass the parameters (> 0) and seconds (>= 0) of the two parts timed");
  StepTail tail;
  tail.measured = true;
  if (params_chain > params_one) {
    const double slope = (seconds_chain - seconds_one) / (params_chain - params_one);
    const double fixed = seconds_one - slope * params_one;
    if (slope > 0 && fixed >= 0) {
      tail.per_parameter = slope;
      tail.fixed = fixed;
      return tail;
    }
    tail.per_parameter = seconds_chain / params_chain;
    return tail;
  }
  tail.per_parameter = seconds_one / params_one;
  return tail;
}

StepTail measure_step_tail(const model::GPT2Config& config, int64_t seq_len,
                           torch::ScalarType autocast, const c10::Device& device,
                           model::Kernels kernels, const StepTailRunner& runner, int reps,
                           int rounds) {
  GPT2P_CHECK(runner != nullptr, "measure_step_tail: no work to time",
              "pass the closure that runs a stage's step after the schedule");
  GPT2P_CHECK(
      seq_len >= 1 && reps >= 1 && rounds >= 1,
      "measure_step_tail: seq_len " << seq_len << ", reps " << reps << ", rounds " << rounds,
      "pass at least one token, one rep and one round");
  const int k = std::min<int>(4, static_cast<int>(config.n_layer));
  // Seconds of the work on blocks [1, 1 + blocks), and the parameters they hold.
  const auto time = [&](int blocks) {
    Part part(config, {1, 1 + blocks}, 1, seq_len, autocast, device, 1.0, kernels);
    part.iteration();  // the gradients
    double params = 0;
    std::vector<torch::Tensor> grads;
    for (auto& p : part.layers()->parameters()) {
      params += static_cast<double>(p.numel());
      if (p.grad().defined()) grads.push_back(p.mutable_grad());
    }
    // A backward leaves gradients to clip; the work zeroes them, so each run first adds them
    // back (all ones: a norm above any clip), and that addition alone is taken off.
    const auto refill = [&grads] {
      torch::NoGradGuard no_grad;
      at::_foreach_add_(grads, 1.0);
    };
    const std::function<void()> work = runner(part.layers());
    const double both = time_work(
        [&] {
          refill();
          work();
        },
        device, 2, reps, rounds);
    const double alone = time_work(refill, device, 2, reps, rounds);
    return std::make_pair(params, std::max(0.0, both - alone));
  };
  const auto [p1, t1] = time(1);
  if (k <= 1) return fit_step_tail(p1, t1, 0.0, 0.0);
  const auto [pk, tk] = time(k);
  return fit_step_tail(p1, t1, pk, tk);
}

std::vector<double> layer_costs_from_times(const LayerTimes& times, int n_layer) {
  GPT2P_CHECK(n_layer >= 1, "layer_costs_from_times: n_layer " << n_layer << " < 1",
              "pass the model's number of transformer blocks");
  std::vector<double> costs(static_cast<size_t>(n_layer) + 2, times.block);
  costs.front() = times.embedding;
  costs.back() = times.head;
  return costs;
}

}  // namespace gpt2p::pipeline
