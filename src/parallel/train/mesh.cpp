#include "gpt2p/parallel/train/mesh.h"

#include <stdexcept>
#include <string>

#include "gpt2p/cli/options.h"

namespace gpt2p::parallel {

Mesh Mesh::build(std::string_view order, const std::vector<int>& sizes, int world, int rank) {
  const auto bad = [&](const std::string& why) {
    return std::invalid_argument("mesh \"" + std::string(order) + "\": " + why);
  };
  Mesh m;
  std::string_view rest = order;
  while (!rest.empty()) {
    const auto dash = rest.find('-');
    const auto name = rest.substr(0, dash);
    const auto dim = from_name<MeshDim>(name);
    if (!dim)
      throw bad("unknown dimension \"" + std::string(name) + "\" (" + choices<MeshDim>() + ")");
    for (const MeshDim d : m.order_) {
      if (d == *dim) throw bad("dimension \"" + std::string(name) + "\" named twice");
    }
    m.order_.push_back(*dim);
    rest = dash == std::string_view::npos ? std::string_view() : rest.substr(dash + 1);
  }
  if (m.order_.size() != sizes.size()) {
    throw bad(std::to_string(m.order_.size()) + " dimensions but " + std::to_string(sizes.size()) +
              " sizes");
  }
  int product = 1;
  for (const int s : sizes) {
    if (s < 1) throw bad("size " + std::to_string(s) + " is below 1");
    product *= s;
  }
  if (product != world || rank < 0 || rank >= world) {
    throw bad("sizes multiply to " + std::to_string(product) + ", not the " +
              std::to_string(world) + " ranks (rank " + std::to_string(rank) + ")");
  }
  // Row-major: the last dimension varies fastest.
  int stride = 1;
  for (size_t i = m.order_.size(); i-- > 0;) {
    const int d = index(m.order_[i]);
    m.size_[d] = sizes[i];
    m.stride_[d] = stride;
    m.coord_[d] = (rank / stride) % sizes[i];
    stride *= sizes[i];
  }
  m.world_ = world;
  m.world_rank_ = rank;
  return m;
}

int Mesh::world_rank_along(MeshDim d, int coord) const {
  const int i = index(d);
  return world_rank_ + (coord - coord_[i]) * stride_[i];
}

int Mesh::group_along(MeshDim d) const {
  // This rank's coordinates without d's, numbered row-major over the other dimensions.
  int group = 0;
  for (const MeshDim o : order_) {
    if (o != d) group = group * size(o) + rank(o);
  }
  return group;
}

std::string Mesh::describe() const {
  if (order_.empty()) return "dp=1";
  std::string s;
  for (const MeshDim d : order_) {
    if (!s.empty()) s += " x ";
    s += std::string(name_of(d)) + "=" + std::to_string(size(d));
  }
  return s;
}

Mesh make_pipeline_mesh(int world, int rank, int dp) {
  if (dp < 1) {
    throw cli::UsageError("--dp " + std::to_string(dp) + ": pass a replica count of 1 or more");
  }
  if (world % dp != 0) {
    throw cli::UsageError("--dp " + std::to_string(dp) + " does not divide the " +
                          std::to_string(world) + " ranks into equal pipelines -- fix: start " +
                          "D x P ranks (mpirun -np <" + std::to_string(dp) + " x P>), or pass " +
                          "a --dp that divides " + std::to_string(world));
  }
  return Mesh::build("dp-pp", {dp, world / dp}, world, rank);
}

void check_mesh_batch(const Mesh& mesh, int64_t batch_size, int microbatches) {
  if (batch_size % mesh.dp() != 0) {
    throw cli::UsageError("--batch-size " + std::to_string(batch_size) + " does not split over " +
                          "--dp " + std::to_string(mesh.dp()) + " replicas -- fix: pass a " +
                          "multiple of " + std::to_string(mesh.dp()));
  }
  const int64_t replica = batch_size / mesh.dp();
  if (replica % microbatches != 0) {
    throw cli::UsageError("--microbatches " + std::to_string(microbatches) + " does not divide " +
                          "a replica's batch of " + std::to_string(replica) + " (--batch-size " +
                          std::to_string(batch_size) + " / --dp " + std::to_string(mesh.dp()) +
                          ") -- fix: pick M dividing " + std::to_string(replica));
  }
}

void check_mesh_zero(const Mesh& mesh, int zero, const std::string& program) {
  if (zero == 0 || mesh.dp() >= 2) return;
  if (program == "pp_train") {
    throw cli::UsageError(
        "pp_train --zero 1 shards each stage's optimizer state over its data-parallel replicas, "
        "but --dp is " +
        std::to_string(mesh.dp()) +
        " -- fix: pass --dp 2 or more (mpirun -np D*P pp_train --dp D), or drop --zero 1");
  }
  throw cli::UsageError(program +
                        " --zero 1 shards the optimizer state over the data-parallel ranks, but "
                        "runs on 1 rank -- fix: start 2 or more (mpirun -np N), or drop --zero 1");
}

Mesh make_job_mesh(const std::string& program, int world, int rank, int dp, int64_t batch_size,
                   int microbatches, int zero) {
  Mesh mesh;
  if (program == "pp_train") {
    mesh = make_pipeline_mesh(world, rank, dp);
    check_mesh_batch(mesh, batch_size, microbatches);
  } else {
    if (program == "gpt2_train" && world != 1) {
      throw cli::UsageError("gpt2_train is the single-rank trainer but runs on " +
                            std::to_string(world) +
                            " ranks -- fix: use mpirun -np N dp_train for data parallelism");
    }
    if (batch_size % world != 0) {
      throw cli::UsageError("--batch-size " + std::to_string(batch_size) +
                            " (global) does not divide over " + std::to_string(world) +
                            " ranks -- fix: pass a global batch that is a multiple of the number "
                            "of ranks");
    }
    mesh = Mesh::build("dp", {world}, world, rank);
  }
  check_mesh_zero(mesh, zero, program);
  return mesh;
}

}  // namespace gpt2p::parallel
