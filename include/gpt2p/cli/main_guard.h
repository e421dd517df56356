// The one way our programs start and end: MPI up, the body run, any error reported in one line and
// the whole job brought down, so that a failing rank never leaves the others hanging.
//
// Two ways an error ends a job:
//  * An error on some ranks only (a bad file on one node, a GPU out of memory, a peer past
//    --comm-timeout): the failing rank prints "<program>: error: [rank R on host] ..." and calls
//    MPI_Abort while MPI is still up, which ends every rank within seconds. (Unwinding first
//    would run MPI_Finalize, which waits for the other ranks: a hang.)
//  * An error checked by every rank at the same point (flags, the configuration, what must
//    exist before training): on_every_rank() runs the check on all ranks, then they agree; the
//    lowest failing rank prints its message, once, and every rank exits with its code (2 for bad
//    usage) through MPI_Finalize, with no abort noise.
#pragma once

#include <chrono>
#include <functional>
#include <stdexcept>
#include <string>

#include "gpt2p/core/mpi_env.h"
#include "gpt2p/core/mpi_wait.h"

namespace gpt2p::cli {

// Exit codes: 0 ok, 1 runtime error (MPI_Abort), 2 bad usage (flags or input files), 75 stopped
// by SIGTERM/SIGINT after a checkpoint was committed (EX_TEMPFAIL: run again with --resume).
inline constexpr int kExitError = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitStopped = 75;

// What on_every_rank() throws on every rank once they agreed that the job ends: run_guarded prints
// what() on the reporting rank and exits with `code` (tests catch it).
struct AgreedFailure : std::runtime_error {
  AgreedFailure(int code, const std::string& message, bool reporter)
      : std::runtime_error(message), code(code), reporter(reporter) {}
  int code;
  bool reporter;  // the lowest failing rank: the one that prints
};

using ProgramBody = std::function<int(const Topology& topo, int argc, char** argv)>;

// Initialises MPI, runs `body`, finalises MPI and returns body's exit code (above).
int run_guarded(const char* program, int argc, char** argv, const ProgramBody& body);

// A library's exception text as run_guarded prints it: torch's appended C++ backtrace ("Exception
// raised from ...", "frame #N: ...") cut off, and for a device out of memory the fix: what uses
// the memory and what trades it.
std::string error_message(const std::string& what);

// Runs `check` on every rank of MPI_COMM_WORLD, then the ranks agree (one small collective, with
// `timeout`). When any rank's check threw, every rank ends the job as described at the top: the
// lowest failing rank prints, all exit with the largest code (kExitUsage for UsageError). Must be
// called by every rank at the same point, before any other collective of the program.
void on_every_rank(const std::function<void()>& check,
                   std::chrono::milliseconds timeout = kDefaultCommTimeout);

}  // namespace gpt2p::cli
