// Running a piece of third-party code where its crash cannot take the program down with it.
//
// libhdf5 crashes (SIGSEGV, aborts) or loops on some damaged files, and a file crafted with a valid
// checksum reaches it. A reader that must never crash on a file from elsewhere therefore reads it
// once in a forked child first: if the child dies or overruns its time, the parent refuses the
// file with one line; if it finishes (having read the file or thrown our error), the parent reads
// it itself and meets the same, now harmless, outcome.
//
//   const IsolatedRun probe = run_isolated([&] { parse(bytes); }, 60.0);
//   GPT2P_CHECK(probe.finished(), path << ": the HDF5 library " << probe.describe() << " reading
//   it",
//               "re-create the file");
//
// The child runs only `fn` and leaves through _exit(0): no exit handlers, no stdio flush, no MPI
// or CUDA call. Exceptions `fn` throws count as finishing. Nothing comes back but the outcome.
#pragma once

#include <functional>
#include <string>

namespace gpt2p {

struct IsolatedRun {
  enum class Kind {
    kFinished,  // fn returned or threw
    kSignal,    // the child died of `signal`
    kExitCode,  // the child exited with `exit_code` (a sanitizer's report, an exit() inside fn)
    kTimedOut,  // the child ran past the timeout and was killed
    kNoFork,    // fork failed (`error` = errno): fn did not run
  };
  Kind kind = Kind::kFinished;
  int signal = 0;
  int exit_code = 0;
  int error = 0;

  bool finished() const { return kind == Kind::kFinished; }
  // "crashed (signal 11: Segmentation fault)", "exited with status 1", "ran for more than 60 s",
  // "could not be started (fork: Cannot allocate memory)".
  std::string describe(double timeout_s) const;
};

// Runs fn in a child process and waits at most timeout_s seconds for it.
IsolatedRun run_isolated(const std::function<void()>& fn, double timeout_s);

}  // namespace gpt2p
