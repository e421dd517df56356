#include "gpt2p/comm/gpu_placement.h"

#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <string>

#include "gpt2p/core/error.h"
#include "gpt2p/core/mpi_wait.h"

namespace gpt2p::comm {

GpuPlacement place_on_gpus(const Topology& world, int gpus, std::chrono::milliseconds timeout) {
  GPT2P_CHECK(gpus >= 1, "no GPU is visible on " << world.host,
              "check CUDA_VISIBLE_DEVICES and the driver (nvidia-smi), or use --device cpu");
  GpuPlacement p;
  p.gpus_on_host = gpus;
  p.ranks_on_host = world.local_size;
  p.gpu = world.local_rank % gpus;
  p.host_shares = world.local_size > gpus;
  p.lowest_on_host = world.local_rank == 0;
  // One job-wide minimum answers both questions: does any host share (-shares), and do all
  // ranks name one host (the hash's minimum equals its maximum).
  const auto hash = static_cast<int>(std::hash<std::string>{}(world.host) & 0x3fffffff);
  int v[3] = {p.host_shares ? -1 : 0, hash, -hash};
  allreduce_ints(v, 3, MPI_MIN, MPI_COMM_WORLD, timeout, "placing the ranks on GPUs");
  p.job_shares = v[0] < 0;
  p.one_host = v[1] == -v[2];
  return p;
}

void give_nccl_ranks_own_hosts(const GpuPlacement& placement, int world_rank) {
  if (!placement.job_shares) return;
  // Once per process: a second call must not stack suffixes.
  static const bool done = [&] {
    std::string id;
    if (const char* set = std::getenv("NCCL_HOSTID"); set != nullptr && *set != '\0') {
      id = set;
    } else {
      char name[256] = {};
      ::gethostname(name, sizeof(name) - 1);
      id = name;
    }
    id += "/rank" + std::to_string(world_rank);
    ::setenv("NCCL_HOSTID", id.c_str(), 1);
    if (placement.one_host) ::setenv("NCCL_SOCKET_IFNAME", "lo", /*overwrite=*/0);
    return true;
  }();
  (void)done;
}

std::string describe_sharing(const GpuPlacement& placement, const std::string& host) {
  return std::to_string(placement.ranks_on_host) + " ranks share " +
         std::to_string(placement.gpus_on_host) + " GPU" + (placement.gpus_on_host == 1 ? "" : "s") +
         " on " + host;
}

}  // namespace gpt2p::comm
