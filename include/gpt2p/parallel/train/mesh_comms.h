// The communicators of a mesh (train/mesh.h): along each dimension a program asks for, one or
// more communicators over the ranks whose coordinates differ only in that dimension, each with
// its own NCCL stream. The pipeline asks for four along pp (activations, gradients, and the two
// that wrap from the last rank to the first: pipeline/plan/schedule.h, Channel); data
// parallelism for one along dp.
#pragma once

#include <array>
#include <memory>
#include <vector>

#include "gpt2p/comm/communicator.h"
#include "gpt2p/parallel/train/mesh.h"

namespace gpt2p::parallel {

class MeshComms {
 public:
  MeshComms() = default;
  // Collective over the world: every rank calls it with the same counts. `channels[d]`: how many
  // communicators to make along dimension d (0: none).
  static MeshComms make(const Mesh& mesh, const comm::CommOptions& options,
                        const std::array<int, kMeshDims>& channels);

  // Channel `channel` along `d`; null where none was asked for.
  comm::Communicator* along(MeshDim d, int channel = 0) const;

 private:
  std::array<std::vector<std::unique_ptr<comm::Communicator>>, kMeshDims> comms_;
};

}  // namespace gpt2p::parallel
