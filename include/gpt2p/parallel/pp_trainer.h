// The pipeline-parallel trainer (pp_train): its setup and its step (a StepStrategy) for the one
// training loop (training_loop.h). GPipe, 1F1B or interleaved over --microbatches, or
// --mode model_parallel (the same split, the whole batch as one micro-batch).
#pragma once

#include <vector>

#include "gpt2p/cli/train_options.h"
#include "gpt2p/comm/communicator.h"
#include "gpt2p/core/mpi_env.h"
#include "gpt2p/model/config.h"
#include "gpt2p/pipeline/partition.h"

namespace gpt2p::parallel {

// The stage split of --partition for `config` over `n_stages` (uniform: HW5's ceil(blocks/stages);
// balanced: partition_balanced of layer_costs_flops at seq_len; measured: partition_balanced of
// `measured_costs`, which that mode needs, from measured_layer_costs). With stages_per_rank > 1
// (interleaved) balanced and measured balance the ranks' loads (partition_interleaved). Throws the
// partition's error when the stage count does not fit the model.
pipeline::Partition stage_partition(const std::string& partition, const model::GPT2Config& config,
                                    int n_stages, int64_t seq_len,
                                    const std::vector<double>& measured_costs = {},
                                    int stages_per_rank = 1, double loss_fraction = 1.0);

// Layer costs for --partition measured: rank 0 times the layers (pipeline/layer_profile.h) for a
// micro-batch of `micro_rows` x `seq_len` on comm's device and broadcasts them, so every rank cuts
// the model the same way. `loss_fraction`: the share of positions the head runs at (see
// measure_layer_times). Collective: every rank of `comm` calls it.
std::vector<double> measured_layer_costs(comm::Communicator& comm,
                                         const model::GPT2Config& config, int64_t micro_rows,
                                         int64_t seq_len, bool bf16, double loss_fraction = 1.0);

// Trains with the parsed flags. World size = number of stages. Writes <out>/rank<r>.h5 (steps,
// epochs, actions), checkpoints under <out>/checkpoint/stage<s>, prints progress on rank 0.
int train_pipeline(const cli::TrainConfig& cfg, const Topology& topo);

}  // namespace gpt2p::parallel
