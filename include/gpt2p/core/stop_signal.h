// SIGTERM, SIGINT and SIGUSR1 as a request to stop cleanly: the trainers finish the step in
// progress, commit a checkpoint, print where it is and exit with kExitStopped (cli/main_guard.h).
// SIGTERM comes from Slurm's pre-emption and scancel (srun signals the ranks), SIGINT from Ctrl-C
// on a rank. mpirun itself turns SIGTERM and SIGINT into killing its ranks a second later, but it
// passes SIGUSR1 on to every rank (Open MPI 4.1.4 does; Ubuntu 24.04's 4.1.6 was seen not to):
// `kill -USR1 <mpirun>` stops an mpirun job cleanly, and the job scripts also signal the ranks
// themselves. A second SIGTERM or SIGINT ends the process at once, as without the handler; a
// second SIGUSR1 changes nothing.
//
// The signal number is the one piece of process-wide state besides the MPI runtime: a signal
// handler can reach nothing else.
#pragma once

#include <string>

namespace gpt2p {

// Installs the handlers for its lifetime (the previous ones come back on destruction).
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The signal received since construction (SIGTERM, SIGINT or SIGUSR1), or 0.
  static int received();

  // Takes the three signals back where a library changed them after construction: a handler
  // put in place of ours is replaced by ours again, and a signal blocked in the calling thread
  // is unblocked there (a signal every thread blocks is never delivered). Returns what was
  // taken back ("SIGUSR1 (handler replaced)"), or "" when nothing had changed. Call it from
  // the thread that constructed the object.
  static std::string reclaim();
};

// "SIGTERM", "SIGINT", or "signal N".
const char* signal_name(int signal);

}  // namespace gpt2p
