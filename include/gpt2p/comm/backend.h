// How ranks talk (torch-free): the trainers' --comm and comm_bench's --backend.
#pragma once

#include <array>

#include "gpt2p/core/names.h"

namespace gpt2p::comm {

// kMpi: CPU tensors, or CUDA tensors staged through host memory; kNccl: CUDA tensors, CUDA builds
// only (ranks that share a GPU: comm/gpu_placement.h). kAuto is a request the program resolves
// (the trainers: NCCL on GPUs, MPI on CPUs); make_communicator needs kMpi or kNccl.
enum class Backend { kAuto, kMpi, kNccl };
constexpr std::array<Named<Backend>, 3> names(Backend) {
  return {{{Backend::kAuto, "auto"}, {Backend::kMpi, "mpi"}, {Backend::kNccl, "nccl"}}};
}

}  // namespace gpt2p::comm
