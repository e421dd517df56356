// Which GPU each rank computes on, and what NCCL needs when ranks share one.
//
// A rank takes GPU (local rank mod GPUs on its host). A host that runs more ranks than it has
// GPUs puts several ranks on one GPU: a laptop, a one-GPU test machine, or a job that checks a
// multi-rank schedule before it gets the GPUs. NCCL refuses two ranks of one host on one GPU
// ("Duplicate GPU detected") because it matches ranks to hosts by a hash of the host name. The
// environment variable NCCL_HOSTID replaces that name: with a value of its own on every rank, NCCL
// takes each rank for a host of its own and connects them with its network transport (sockets,
// the path NCCL uses between nodes), through host memory. Results are those of any NCCL run;
// timings are functional, not speed figures.
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include "gpt2p/core/mpi_env.h"

namespace gpt2p::comm {

struct GpuPlacement {
  int gpu = 0;                 // this rank's GPU on its host
  int ranks_on_host = 1;       // the job's ranks on this rank's host
  int gpus_on_host = 1;        // distinct GPUs the host's ranks use
  bool host_shares = false;    // two ranks of this host use one GPU
  bool job_shares = false;     // two ranks of some host do
  bool one_host = true;        // every rank of the job runs on this rank's host
  bool lowest_on_host = true;  // local rank 0: prints this host's note
};

// Collective over MPI_COMM_WORLD (every rank calls it, timed by `timeout`): this rank's GPU out of
// `gpus` visible ones (local rank mod gpus, `gpus` >= 1), and how the job's ranks share GPUs.
// `gpu_id(index)` names a visible GPU so that processes of one host can compare them (its PCI bus
// id: a launcher may give every rank its own CUDA_VISIBLE_DEVICES, so that each sees one GPU
// while all use different ones).
GpuPlacement place_on_gpus(const Topology& world, int gpus,
                           const std::function<std::string(int)>& gpu_id,
                           std::chrono::milliseconds timeout);

// Before this process's first NCCL call (nothing may call NCCL earlier: it reads its environment
// once), on every rank of a host whose ranks share a GPU (host_shares):
// NCCL_HOSTID=<host id>/rank<world rank>, the host id being NCCL_HOSTID as it was set, else the
// host name, so no two ranks of the host report one host. When the job runs on one host, also
// NCCL_SOCKET_IFNAME=lo and NCCL_NET=Socket (each only where unset): the socket transport over
// loopback. Harmless without NCCL.
void give_nccl_ranks_own_hosts(const GpuPlacement& placement, int world_rank);

// "2 ranks share 1 GPU on <host>": for start-up lines and notes.
std::string describe_sharing(const GpuPlacement& placement, const std::string& host);

}  // namespace gpt2p::comm
