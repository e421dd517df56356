// The one way our programs start: MPI up, the body run, any error reported in one line and the
// whole job brought down with MPI_Abort (so a failing rank never leaves the others hanging).
#pragma once

#include <functional>

#include "gpt2p/core/mpi_env.h"

namespace gpt2p::cli {

// Exit codes: 0 ok, 1 runtime error (MPI_Abort), 2 bad usage (flags or input files).
inline constexpr int kExitError = 1;
inline constexpr int kExitUsage = 2;

using ProgramBody = std::function<int(const Topology& topo, int argc, char** argv)>;

// Initialises MPI, runs `body`, finalises MPI. Exceptions are printed as
// "<program>: error: <message>" by the failing rank; in a multi-rank job MPI_Abort follows.
int run_guarded(const char* program, int argc, char** argv, const ProgramBody& body);

}  // namespace gpt2p::cli
