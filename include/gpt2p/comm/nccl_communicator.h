// The NCCL backend of the Communicator: CUDA tensors on the rank's GPU (CommOptions::device, else
// the local rank's; ranks that share a GPU: comm/gpu_placement.h).
// Defined only in CUDA builds (GPT2P_WITH_CUDA); the class itself lives in the .cpp so that no
// CUDA or NCCL header leaks into code that includes this one. See communicator.h for the
// stream contract. Call make_communicator({Backend::kNccl}) rather than this directly.
#pragma once

#include <memory>

#include "gpt2p/comm/communicator.h"

namespace gpt2p::comm {

#ifdef GPT2P_WITH_CUDA
// Bootstraps NCCL from MPI: duplicates `comm`, sets the CUDA device (above), rank 0
// makes the ncclUniqueId, MPI_Bcast sends it, every rank calls ncclCommInitRank.
std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm, const CommOptions& options);
#endif

}  // namespace gpt2p::comm
