// SIGTERM, SIGINT and SIGUSR1 as a request to stop cleanly: the trainers finish the step in
// progress, commit a checkpoint, print where it is and exit with kExitStopped (cli/main_guard.h).
// SIGTERM comes from Slurm's pre-emption and scancel (srun signals the ranks), SIGINT from Ctrl-C
// on a rank. mpirun itself turns SIGTERM and SIGINT into killing its ranks a second later, but it
// passes SIGUSR1 on to every rank: `kill -USR1 <mpirun>` stops an mpirun job cleanly. A second
// signal of the same kind ends the process at once, as without the handler.
//
// The signal number is the one piece of process-wide state besides the MPI runtime: a signal
// handler can reach nothing else.
#pragma once

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
};

// "SIGTERM", "SIGINT", or "signal N".
const char* signal_name(int signal);

}  // namespace gpt2p
