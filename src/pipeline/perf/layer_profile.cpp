#include "gpt2p/pipeline/perf/layer_profile.h"

#include <algorithm>
#include <chrono>
#include <limits>

#include "gpt2p/compat/device.h"
#include "gpt2p/core/error.h"
#include "gpt2p/model/gpt2.h"
#include "gpt2p/pipeline/runtime/stage.h"

namespace gpt2p::pipeline {
namespace {

// Fastest round's seconds per forward + backward of `range` alone on `device`.
double time_layers(const model::GPT2Config& config, model::LayerRange range, int64_t rows,
                   int64_t seq_len, bool bf16, const torch::Device& device, int warmup, int reps,
                   int rounds, double loss_fraction) {
  model::GPT2 layers(config, range);
  layers->reset_parameters(/*seed=*/1);
  layers->to(device);
  layers->train();
  GptStage stage(layers, /*n_microbatches=*/1, bf16);

  const auto ids = torch::TensorOptions().dtype(torch::kInt64).device(device);
  StageBatch batch;
  batch.inputs = torch::randint(config.vocab_size, {rows, seq_len}, ids);
  batch.labels = torch::randint(config.vocab_size, {rows, seq_len}, ids);
  // The first `counted` positions of each row count, as the target span of a translation pair.
  const auto counted = std::clamp<int64_t>(
      static_cast<int64_t>(std::llround(loss_fraction * static_cast<double>(seq_len))), 1, seq_len);
  batch.host_mask = torch::zeros({rows, seq_len});
  batch.host_mask.narrow(1, 0, counted).fill_(1.0);
  batch.mask = batch.host_mask.to(device);
  batch.global_target_tokens = rows * counted;
  stage.set_batch(batch);
  torch::Tensor hidden;
  if (!stage.is_first())
    hidden = torch::randn({rows, seq_len, config.n_embd}, ids.dtype(torch::kFloat32));

  // What the executor does per micro-batch: forward, then backward with the output's gradient
  // (the loss's own on the last stage). A received activation requires grad, as in the executor.
  const auto iteration = [&] {
    const torch::Tensor input =
        stage.is_first() ? stage.input(0) : hidden.detach().requires_grad_(true);
    const torch::Tensor out = stage.forward(0, input);
    stage.backward(0, out, stage.is_last() ? torch::Tensor() : torch::ones_like(out));
  };
  for (int i = 0; i < warmup; ++i) iteration();
  double best = std::numeric_limits<double>::infinity();
  for (int r = 0; r < rounds; ++r) {
    compat::synchronize(device);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) iteration();
    compat::synchronize(device);
    const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
    best = std::min(best, dt.count() / reps);
  }
  stage.take_loss();
  return best;
}

}  // namespace

LayerTimes measure_layer_times(const model::GPT2Config& config, int64_t micro_rows, int64_t seq_len,
                               bool bf16, const c10::Device& device, int warmup, int reps,
                               int rounds, double loss_fraction) {
  GPT2P_CHECK(micro_rows >= 1 && seq_len >= 1 && reps >= 1 && rounds >= 1 && warmup >= 0,
              "measure_layer_times: micro_rows " << micro_rows << ", seq_len " << seq_len
                                                 << ", reps " << reps << ", rounds " << rounds
                                                 << ", warmup " << warmup,
              "pass at least one row, one token, one rep and one round (warmup >= 0)");
  GPT2P_CHECK(loss_fraction > 0 && loss_fraction <= 1,
              "measure_layer_times: loss fraction " << loss_fraction << " is not in (0, 1]",
              "pass the share of positions whose loss counts, e.g. 0.094 for HW5's data");
  const int64_t L = config.n_layer;
  const auto time = [&](int64_t begin, int64_t end) {
    const model::LayerRange range{static_cast<int>(begin), static_cast<int>(end)};
    return time_layers(config, range, micro_rows, seq_len, bf16, device, warmup, reps, rounds,
                       loss_fraction);
  };
  const double one = time(1, 2), embedding = time(0, 1), head = time(L + 1, L + 2);
  double stage = 0.0;
  const int64_t k = std::min<int64_t>(4, L);
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
  return t;
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
