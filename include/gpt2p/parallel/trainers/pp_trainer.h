// The pipeline-parallel trainer (pp_train): its setup and its step (a StepStrategy) for the one
// training loop (train/loop.h). GPipe, 1F1B or interleaved over --microbatches, or
// --mode model_parallel (the same split, the whole batch as one micro-batch).
#pragma once

#include "gpt2p/core/mpi_env.h"
#include "gpt2p/parallel/train/options.h"
#include "gpt2p/parallel/trainers/stage_split.h"

namespace gpt2p::parallel {

// Trains with the parsed flags. World size = number of stages. Writes <out>/rank<r>.h5 (steps,
// epochs, actions), checkpoints under <out>/checkpoint/stage<s>, prints progress on rank 0.
int train_pipeline(const parallel::TrainConfig& cfg, const Topology& topo);

}  // namespace gpt2p::parallel
