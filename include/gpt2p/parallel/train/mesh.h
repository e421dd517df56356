// The ranks of a pipeline job as a grid: D data-parallel replicas of one P-rank pipeline
// (torchtitan's ParallelDims; Megatron's data and pipeline groups). Torch-free.
//
// World rank r is pipeline rank r % P of replica r / P. A pipeline's ranks are consecutive, so
// mpirun's default by-slot placement puts a pipeline's neighbours, which exchange activations and
// gradients at every micro-batch, on one node first; a data-parallel group (one pipeline rank of
// every replica), which reduces gradients once per step, spans the replicas, and nodes.
//
//   mpirun -np 4 pp_train --dp 2      world ranks  0 1 | 2 3
//                                     replica      0 0 | 1 1
//                                     pipeline     0 1 | 0 1   (stage 0 on ranks 0, 2)
#pragma once

#include <cstdint>
#include <string>

namespace gpt2p::parallel {

struct Mesh {
  int dp = 1;       // D: replicas
  int pp = 1;       // P: pipeline ranks per replica
  int dp_rank = 0;  // this rank's replica
  int pp_rank = 0;  // this rank's place in its pipeline
  int world() const { return dp * pp; }
  int world_rank(int replica, int pipeline_rank) const { return replica * pp + pipeline_rank; }
};

// World rank `rank` of `world` ranks in D = `dp` replicas. Throws cli::UsageError (exit 2) when
// dp < 1 or dp does not divide world, naming the numbers and the fix.
Mesh make_mesh(int world, int rank, int dp);

// Throws cli::UsageError unless the global batch splits into D equal replica batches of
// `microbatches` equal micro-batches each.
void check_mesh_batch(const Mesh& mesh, int64_t batch_size, int microbatches);

// Throws cli::UsageError when ZeRO stage `zero` has nothing to shard over: fewer than 2
// data-parallel ranks (D). `program`: "dp_train", "gpt2_train" or "pp_train", for the message.
void check_mesh_zero(const Mesh& mesh, int zero, const std::string& program);

}  // namespace gpt2p::parallel
