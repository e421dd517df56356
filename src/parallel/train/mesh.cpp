#include "gpt2p/parallel/train/mesh.h"

#include <string>

#include "gpt2p/cli/options.h"

namespace gpt2p::parallel {

Mesh make_mesh(int world, int rank, int dp) {
  if (dp < 1) {
    throw cli::UsageError("--dp " + std::to_string(dp) + ": pass a replica count of 1 or more");
  }
  if (world % dp != 0) {
    throw cli::UsageError("--dp " + std::to_string(dp) + " does not divide the " +
                          std::to_string(world) + " ranks into equal pipelines -- fix: start " +
                          "D x P ranks (mpirun -np <" + std::to_string(dp) + " x P>), or pass " +
                          "a --dp that divides " + std::to_string(world));
  }
  Mesh m;
  m.dp = dp;
  m.pp = world / dp;
  m.dp_rank = rank / m.pp;
  m.pp_rank = rank % m.pp;
  return m;
}

void check_mesh_batch(const Mesh& mesh, int64_t batch_size, int microbatches) {
  if (batch_size % mesh.dp != 0) {
    throw cli::UsageError("--batch-size " + std::to_string(batch_size) + " does not split over " +
                          "--dp " + std::to_string(mesh.dp) + " replicas -- fix: pass a " +
                          "multiple of " + std::to_string(mesh.dp));
  }
  const int64_t replica = batch_size / mesh.dp;
  if (replica % microbatches != 0) {
    throw cli::UsageError("--microbatches " + std::to_string(microbatches) + " does not divide " +
                          "a replica's batch of " + std::to_string(replica) + " (--batch-size " +
                          std::to_string(batch_size) + " / --dp " + std::to_string(mesh.dp) +
                          ") -- fix: pick M dividing " + std::to_string(replica));
  }
}

void check_mesh_zero(const Mesh& mesh, int zero, const std::string& program) {
  if (zero == 0 || mesh.dp >= 2) return;
  if (program == "pp_train") {
    throw cli::UsageError(
        "pp_train --zero 1 shards each stage's optimizer state over its data-parallel replicas, "
        "but --dp is " +
        std::to_string(mesh.dp) +
        " -- fix: pass --dp 2 or more (mpirun -np D*P pp_train --dp D), or drop --zero 1");
  }
  throw cli::UsageError(program +
                        " --zero 1 shards the optimizer state over the data-parallel ranks, but "
                        "runs on 1 rank -- fix: start 2 or more (mpirun -np N), or drop --zero 1");
}

}  // namespace gpt2p::parallel
