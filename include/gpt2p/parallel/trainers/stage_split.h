// How a pipeline's layers are split into stages: by --partition for a fresh run (from FLOPs or
// from layer times measured on the GPU), or as a checkpoint was written for a resumed one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gpt2p/comm/communicator.h"
#include "gpt2p/model/config.h"
#include "gpt2p/model/options.h"
#include "gpt2p/pipeline/perf/layer_profile.h"
#include "gpt2p/pipeline/plan/partition.h"

namespace gpt2p::parallel {

// The stage split of --partition for `config` over `n_stages` (uniform: HW5's ceil(blocks/stages);
// balanced: partition_balanced of layer_costs_flops at seq_len; measured: partition_balanced of
// `measured_costs`, which that mode needs, from measured_layer_costs). With stages_per_rank > 1
// (interleaved) balanced and measured balance the ranks' loads (partition_interleaved). Throws the
// partition's error when the stage count does not fit the model.
pipeline::Partition stage_partition(pipeline::PartitionKind partition,
                                    const model::GPT2Config& config, int n_stages, int64_t seq_len,
                                    const std::vector<double>& measured_costs = {},
                                    int stages_per_rank = 1, double loss_fraction = 1.0);

// Layer costs for --partition measured: rank 0 times the layers (pipeline/perf/layer_profile.h) for
// a micro-batch of `micro_rows` x `seq_len` on comm's device and broadcasts them, so every rank
// cuts the model the same way. `timing` as the run runs its stages (the data's loss fraction, its
// --loss-positions, resolved --kernels, whether its stages run as CUDA graphs, its M); the
// activation bytes are not measured. Collective: every rank of `comm` calls it.
std::vector<double> measured_layer_costs(comm::Communicator& comm, const model::GPT2Config& config,
                                         int64_t micro_rows, int64_t seq_len,
                                         torch::ScalarType autocast,
                                         pipeline::LayerTiming timing = {});

// A resumed run keeps the split its checkpoint was written with: stage s's layer range from
// <resume>/stage<s>/meta.json. Throws naming the checkpoint when it holds another number of
// stages, or stages that do not agree.
pipeline::Partition checkpoint_partition(const std::string& resume, int n_stages, int dp = 1);

}  // namespace gpt2p::parallel
