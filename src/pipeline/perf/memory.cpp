#include "gpt2p/pipeline/perf/memory.h"

#include <algorithm>
#include <cmath>

#include "gpt2p/core/error.h"

namespace gpt2p::pipeline {

ActivationBytes estimate_activation_bytes(const model::GPT2Config& config, int64_t rows,
                                          int64_t seq_len, bool bf16, double loss_fraction) {
  GPT2P_CHECK(rows >= 1 && seq_len >= 1,
              "estimate_activation_bytes: rows " << rows << ", seq_len " << seq_len,
              "pass at least one row and one token");
  GPT2P_CHECK(loss_fraction > 0 && loss_fraction <= 1,
              "estimate_activation_bytes: loss fraction " << loss_fraction << " is not in (0, 1]",
              "pass the share of positions whose loss counts");
  const double e = bf16 ? 2.0 : 4.0;
  const double c = static_cast<double>(config.n_embd), h = static_cast<double>(config.n_head);
  const double d = config.dropout > 0 ? 1.0 : 0.0;
  const double tokens = static_cast<double>(rows * seq_len);
  // Positions per row where the head runs, as the layer profile counts them.
  const auto counted = std::clamp<int64_t>(
      static_cast<int64_t>(std::llround(loss_fraction * static_cast<double>(seq_len))), 1, seq_len);
  const double loss_positions = static_cast<double>(rows * counted);

  ActivationBytes b;
  const double per_token_block = 2 * 8.0      // ln_1 and ln_2: mean and inverse deviation
                                 + c * e      // ln_1's output, c_attn's input
                                 + 3 * c * e  // q, k, v
                                 + c * e      // attention's output
                                 + 4 * h      // its log-sum-exp per head (fp32)
                                 + c * e      // the output made contiguous, c_proj's input
                                 + 4 * c      // x + attn(ln_1(x)), ln_2's input (fp32)
                                 + c * e      // ln_2's output, c_fc's input
                                 + 4 * c * e  // c_fc's output, GELU's input
                                 + 4 * c * e  // GELU's output, mlp.c_proj's input
                                 + 2 * c * d  // residual and MLP dropout masks (bool)
                                 + 4 * c;     // the block's output (fp32)
  b.block = tokens * per_token_block;
  b.block_weight_copies = bf16 ? 2.0 * 12.0 * c * c : 0.0;
  b.block_recompute = tokens * 4 * c;
  b.embedding = tokens * (c * d + 4 * c) + 8.0 * static_cast<double>(seq_len);
  b.head = tokens * 8.0 + loss_positions * (4 * c + 8.0) +
           4.0 * static_cast<double>(config.padded_vocab_size()) * c;
  b.stage_input = tokens * 4 * c;
  b.measured = false;
  return b;
}

double state_bytes_per_parameter(const MemoryModel& model) {
  GPT2P_CHECK(model.replicas >= 1, "predict_memory: " << model.replicas << " replicas",
              "pass at least one data-parallel replica");
  if (model.replicas == 1) return 4.0 + 4.0 + 8.0;
  // Replicas sum their gradients through a bucket copy of them (grad_buckets.h); ZeRO-1 shards
  // the moments and keeps its shard's reduced gradient.
  if (!model.zero1) return 4.0 + 4.0 + 4.0 + 8.0;
  const double d = model.replicas;
  return 4.0 + 4.0 + 4.0 + 8.0 / d + 4.0 / d;
}

double stage_parameters(const model::GPT2Config& config, const LayerRange& stage) {
  double params = 0;
  for (int l = stage.begin; l < stage.end; ++l)
    params += static_cast<double>(config.layer_parameters(l));
  if (stage.end == config.num_stage_layers() && stage.begin > 0) {
    params += static_cast<double>(config.padded_vocab_size() * config.n_embd);
  }
  return params;
}

std::vector<double> stage_activation_bytes(const ActivationBytes& bytes, const Partition& partition,
                                           int n_layer, model::Recompute recompute) {
  const double block = recompute == model::Recompute::kBlocks ? bytes.block_recompute : bytes.block;
  std::vector<double> out;
  for (const LayerRange& stage : partition) {
    double kept = stage.begin > 0 ? bytes.stage_input : 0.0;
    for (int l = stage.begin; l < stage.end; ++l) {
      kept += l == 0 ? bytes.embedding : l == n_layer + 1 ? bytes.head : block;
    }
    out.push_back(kept);
  }
  return out;
}

std::vector<double> peak_activation_bytes(const Schedule& schedule,
                                          const std::vector<double>& stage_bytes) {
  std::vector<double> peak;
  for (const RankActions& actions : schedule) {
    const bool split = std::any_of(actions.begin(), actions.end(),
                                   [](const Action& a) { return a.op == Action::Op::kWeight; });
    const Action::Op release = split ? Action::Op::kWeight : Action::Op::kBackward;
    double live = 0, most = 0;
    for (const Action& a : actions) {
      GPT2P_CHECK(a.stage >= 0 && static_cast<size_t>(a.stage) < stage_bytes.size(),
                  "peak_activation_bytes: action " << to_string(a) << " names a stage outside the "
                                                   << stage_bytes.size() << " given",
                  "pass one byte count per stage of the schedule");
      if (a.op == Action::Op::kForward) live += stage_bytes[static_cast<size_t>(a.stage)];
      if (a.op == release) live -= stage_bytes[static_cast<size_t>(a.stage)];
      most = std::max(most, live);
    }
    peak.push_back(most);
  }
  return peak;
}

std::vector<RankMemory> predict_memory(const model::GPT2Config& config, const Partition& partition,
                                       const Schedule& schedule, const ActivationBytes& bytes,
                                       const MemoryModel& model) {
  const size_t ranks = schedule.size();
  GPT2P_CHECK(ranks >= 1 && partition.size() % ranks == 0,
              "predict_memory: " << partition.size() << " stages on " << ranks << " ranks",
              "pass the partition the schedule runs (ranks x stages per rank stages)");
  const double per_parameter = state_bytes_per_parameter(model);
  const int n_layer = static_cast<int>(config.n_layer);
  const auto kept = stage_activation_bytes(bytes, partition, n_layer, model.recompute);
  const auto live = peak_activation_bytes(schedule, kept);
  std::vector<RankMemory> out(ranks);
  for (size_t s = 0; s < partition.size(); ++s) {
    RankMemory& r =
        out[static_cast<size_t>(rank_of_stage(static_cast<int>(s), static_cast<int>(ranks)))];
    r.states += per_parameter * stage_parameters(config, partition[s]);
    const int blocks =
        std::max(0, std::min(partition[s].end, n_layer + 1) - std::max(partition[s].begin, 1));
    r.weight_copies += bytes.block_weight_copies * blocks;
    const bool has_block = blocks > 0;
    if (model.recompute == model::Recompute::kBlocks && has_block) r.recompute = bytes.block;
  }
  for (size_t r = 0; r < ranks; ++r) out[r].activations = live[r];
  if (model.replicas == 1) {
    const auto m = std::count_if(schedule[0].begin(), schedule[0].end(), [](const Action& a) {
      return a.op == Action::Op::kForward && a.stage == 0;
    });
    if (m > 1) out[0].lookup_grads = static_cast<double>(m) * bytes.stage_input;
  }
  return out;
}

}  // namespace gpt2p::pipeline
