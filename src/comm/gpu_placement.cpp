#include "gpt2p/comm/gpu_placement.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "gpt2p/core/error.h"
#include "gpt2p/core/mpi_wait.h"

namespace gpt2p::comm {

GpuPlacement place_on_gpus(const Topology& world, int gpus,
                           const std::function<std::string(int)>& gpu_id,
                           std::chrono::milliseconds timeout) {
  GPT2P_CHECK(gpus >= 1, "no GPU is visible on " << world.host,
              "check CUDA_VISIBLE_DEVICES and the driver (nvidia-smi), or use --device cpu");
  GpuPlacement p;
  p.ranks_on_host = world.local_size;
  p.gpu = world.local_rank % gpus;
  p.lowest_on_host = world.local_rank == 0;
  p.one_host = world.local_size == world.size;
  // Every rank of the host learns every other's GPU id (fixed-size, NUL-padded).
  constexpr int kIdBytes = 64;
  std::array<char, kIdBytes> mine{};
  std::string id = gpu_id(p.gpu);
  if (id.empty()) id = "visible GPU " + std::to_string(p.gpu);  // no id: compare the indices
  std::copy_n(id.begin(), std::min<size_t>(id.size(), kIdBytes - 1), mine.begin());
  MPI_Comm host = MPI_COMM_NULL;
  GPT2P_MPI_CHECK(
      MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world.rank, MPI_INFO_NULL, &host));
  std::vector<char> all(static_cast<size_t>(kIdBytes) * static_cast<size_t>(world.local_size));
  MPI_Request r = MPI_REQUEST_NULL;
  GPT2P_MPI_CHECK(
      MPI_Iallgather(mine.data(), kIdBytes, MPI_CHAR, all.data(), kIdBytes, MPI_CHAR, host, &r));
  wait_all(&r, 1, timeout, [] { return std::string("comparing the GPUs of this host's ranks"); });
  GPT2P_MPI_CHECK(MPI_Comm_free(&host));
  std::set<std::string> distinct;
  for (int i = 0; i < world.local_size; ++i) {
    distinct.insert(std::string(all.data() + static_cast<size_t>(i) * kIdBytes));
  }
  p.gpus_on_host = static_cast<int>(distinct.size());
  p.host_shares = p.gpus_on_host < world.local_size;
  int shares = p.host_shares ? 1 : 0;
  allreduce_ints(&shares, 1, MPI_MAX, MPI_COMM_WORLD, timeout, "placing the ranks on GPUs");
  p.job_shares = shares != 0;
  return p;
}

void give_nccl_ranks_own_hosts(const GpuPlacement& placement, int world_rank) {
  if (!placement.host_shares) return;
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
    if (placement.one_host) {
      ::setenv("NCCL_SOCKET_IFNAME", "lo", /*overwrite=*/0);
      ::setenv("NCCL_NET", "Socket", /*overwrite=*/0);  // not InfiniBand where a host has it
    }
    return true;
  }();
  (void)done;
}

std::string describe_sharing(const GpuPlacement& placement, const std::string& host) {
  return std::to_string(placement.ranks_on_host) + " ranks share " +
         std::to_string(placement.gpus_on_host) + " GPU" +
         (placement.gpus_on_host == 1 ? "" : "s") + " on " + host;
}

}  // namespace gpt2p::comm
