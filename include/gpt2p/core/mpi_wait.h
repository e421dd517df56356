// Waiting on MPI with a deadline. A blocking MPI call waits forever for a peer that is stopped,
// stuck in another call or dead without its process ending; every wait of ours polls instead and,
// past the job's --comm-timeout, throws gpt2p::Error naming the operation and its peers, which
// run_guarded turns into MPI_Abort. So a stuck peer ends the job instead of hanging it.
#pragma once

#include <mpi.h>

#include <chrono>
#include <functional>
#include <string>

namespace gpt2p {

// The --comm-timeout default, also used before the flags are parsed.
inline constexpr std::chrono::milliseconds kDefaultCommTimeout{60000};

// Polls MPI_Testall on `count` requests until all complete. Past `timeout` throws gpt2p::Error:
// "<describe()>: not complete after <timeout>" with the fix. MPI errors throw as GPT2P_MPI_CHECK.
void wait_all(MPI_Request* requests, int count, std::chrono::milliseconds timeout,
              const std::function<std::string()>& describe);

// MPI_Allreduce of `count` ints in place, through MPI_Iallreduce and wait_all.
void allreduce_ints(int* values, int count, MPI_Op op, MPI_Comm comm,
                    std::chrono::milliseconds timeout, const char* what);

// MPI_Bcast of `count` bytes from `root`, through MPI_Ibcast and wait_all.
void broadcast_bytes(void* data, int count, int root, MPI_Comm comm,
                     std::chrono::milliseconds timeout, const char* what);

// MPI_Barrier through MPI_Ibarrier and wait_all.
void barrier(MPI_Comm comm, std::chrono::milliseconds timeout, const char* what);

}  // namespace gpt2p
