// The data-parallel trainer, which is also the single-rank one (world size 1, no sync): its setup
// and its step (a StepStrategy) for the one training loop (train/loop.h).
#pragma once

#include "gpt2p/core/mpi_env.h"
#include "gpt2p/parallel/train/options.h"

namespace gpt2p::parallel {

// Trains as `program` (kSingle: gpt2_train, must be one rank; kDataParallel: dp_train) with the
// parsed flags. Writes <out>/rank<r>.h5, checkpoints under <out>/checkpoint, prints progress.
int train_data_parallel(const parallel::TrainConfig& cfg, parallel::Program program,
                        const Topology& topo);

}  // namespace gpt2p::parallel
