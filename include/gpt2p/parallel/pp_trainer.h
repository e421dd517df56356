// The pipeline-parallel training loop (pp_train): one stage per rank, GPipe or 1F1B over
// --microbatches, or --mode model_parallel (the same split, the whole batch as one micro-batch).
#pragma once

#include "gpt2p/cli/train_options.h"
#include "gpt2p/core/mpi_env.h"
#include "gpt2p/model/config.h"
#include "gpt2p/pipeline/partition.h"

namespace gpt2p::parallel {

// The stage split of --partition for `config` over `n_stages` (uniform: HW5's ceil(blocks/stages);
// balanced: partition_balanced of layer_costs_flops at seq_len). Throws the partition's error when
// the world size does not fit the model.
pipeline::Partition stage_partition(const std::string& partition, const model::GPT2Config& config,
                                    int n_stages, int64_t seq_len);

// Trains with the parsed flags. World size = number of stages. Writes <out>/rank<r>.h5 (steps,
// epochs, actions), checkpoints under <out>/checkpoint/stage<s>, prints progress on rank 0.
int train_pipeline(const cli::TrainConfig& cfg, const Topology& topo);

}  // namespace gpt2p::parallel
