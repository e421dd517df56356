#include "gpt2p/parallel/train/mesh_comms.h"

#include "gpt2p/core/error.h"

namespace gpt2p::parallel {

MeshComms MeshComms::make(const Mesh& mesh, const comm::CommOptions& options,
                          const std::array<int, kMeshDims>& channels) {
  MeshComms out;
  for (int i = 0; i < kMeshDims; ++i) {
    if (channels[i] == 0) continue;
    const auto d = static_cast<MeshDim>(i);
    // A group that spans the world needs no split; MPI_Comm_split orders a group's ranks by the
    // key, their coordinate along d.
    MPI_Comm group = MPI_COMM_WORLD;
    const bool split = mesh.size(d) != mesh.world();
    if (split) {
      GPT2P_MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, mesh.group_along(d), mesh.rank(d), &group));
    }
    for (int c = 0; c < channels[i]; ++c) {
      out.comms_[i].push_back(comm::make_communicator(options, group));
    }
    // The communicators hold duplicates of the group.
    if (split) GPT2P_MPI_CHECK(MPI_Comm_free(&group));
  }
  return out;
}

comm::Communicator* MeshComms::along(MeshDim d, int channel) const {
  const auto& list = comms_[static_cast<int>(d)];
  return channel < static_cast<int>(list.size()) ? list[channel].get() : nullptr;
}

}  // namespace gpt2p::parallel
