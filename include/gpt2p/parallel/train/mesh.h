// A job's ranks as a grid with named dimensions (torch's DeviceMesh, torchtitan's ParallelDims,
// Megatron's RankGenerator). Torch-free.
//
// The order string names the dimensions outermost first, row-major as in torch: in "dp-pp" the
// pipeline coordinate varies fastest, so world rank r is pipeline rank r % P of replica r / P. A
// pipeline's ranks are then consecutive, so mpirun's default by-slot placement puts a pipeline's
// neighbours, which exchange activations and gradients at every micro-batch, on one node first;
// a data-parallel group (one pipeline rank of every replica), which reduces gradients once per
// step, spans the replicas, and nodes.
//
//   dp_train:  mesh "dp"     sizes {N}
//   pp_train:  mesh "dp-pp"  sizes {D, P}
//
//   mpirun -np 4 pp_train --dp 2      world ranks  0 1 | 2 3
//                                     dp (replica) 0 0 | 1 1
//                                     pp           0 1 | 0 1   (stage 0 on ranks 0, 2)
//
// A group "along" a dimension is the ranks whose coordinates differ only in that dimension: along
// pp, one replica's pipeline; along dp, one pipeline rank of every replica. train/mesh_comms.h
// gives each such group its communicators. A new kind of parallelism (tensor parallel, "tp") is
// one more MeshDim and a place in a program's order string.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "gpt2p/core/names.h"

namespace gpt2p::parallel {

enum class MeshDim { kDp, kPp };
constexpr std::array<Named<MeshDim>, 2> names(MeshDim) {
  return {{{MeshDim::kDp, "dp"}, {MeshDim::kPp, "pp"}}};
}
inline constexpr int kMeshDims = 2;

class Mesh {
 public:
  // One rank: every dimension of size 1.
  Mesh() = default;

  // World rank `rank` of a grid of `world` ranks laid out by `order` (dimension names outermost
  // first, joined by '-') with `sizes` (one per name, in order). Throws std::invalid_argument
  // when a name is unknown or repeated, a size is below 1, or the sizes' product is not `world`
  // (the programs check their flags first, with messages that name them: make_job_mesh).
  static Mesh build(std::string_view order, const std::vector<int>& sizes, int world, int rank);

  // 1 / 0 for a dimension that is not in the mesh.
  int size(MeshDim d) const { return size_[index(d)]; }
  int rank(MeshDim d) const { return coord_[index(d)]; }
  int world() const { return world_; }
  int world_rank() const { return world_rank_; }
  // The dimensions, outermost first.
  const std::vector<MeshDim>& order() const { return order_; }
  // The innermost dimension (the one whose ranks are consecutive); kDp for a one-rank mesh.
  MeshDim innermost() const { return order_.empty() ? MeshDim::kDp : order_.back(); }
  // The world rank of the rank whose coordinates are this rank's, but `coord` along `d`.
  int world_rank_along(MeshDim d, int coord) const;
  // The groups along `d`, numbered 0..world/size(d)-1; ranks in one group share the number (the
  // colour of MPI_Comm_split; the key is rank(d)).
  int group_along(MeshDim d) const;
  // "dp=2 x pp=3"; "dp=1" for one rank.
  std::string describe() const;

  // The two dimensions the programs have, by name.
  int dp() const { return size(MeshDim::kDp); }
  int pp() const { return size(MeshDim::kPp); }
  int dp_rank() const { return rank(MeshDim::kDp); }
  int pp_rank() const { return rank(MeshDim::kPp); }

 private:
  static int index(MeshDim d) { return static_cast<int>(d); }
  std::vector<MeshDim> order_;
  std::array<int, kMeshDims> size_{1, 1};
  std::array<int, kMeshDims> coord_{0, 0};
  // Distance in world ranks between neighbours along each dimension (row-major strides).
  std::array<int, kMeshDims> stride_{1, 1};
  int world_ = 1, world_rank_ = 0;
};

// The job's mesh, validated once: dp_train and gpt2_train are "dp" over every rank; pp_train is
// "dp-pp" with D = `dp` replicas. Throws cli::UsageError (exit 2) naming the flags and the fix
// when D does not divide the ranks, the global batch does not split into D replica batches of
// `microbatches` equal micro-batches, or ZeRO stage `zero` has fewer than 2 data-parallel ranks
// to shard over. `program`: "dp_train", "gpt2_train" or "pp_train".
Mesh make_job_mesh(const std::string& program, int world, int rank, int dp, int64_t batch_size,
                   int microbatches, int zero);

// The checks make_job_mesh runs, one by one (the tests call them with the messages' numbers).
// make_pipeline_mesh throws cli::UsageError when dp < 1 or dp does not divide world.
Mesh make_pipeline_mesh(int world, int rank, int dp);
void check_mesh_batch(const Mesh& mesh, int64_t batch_size, int microbatches);
void check_mesh_zero(const Mesh& mesh, int zero, const std::string& program);

}  // namespace gpt2p::parallel
