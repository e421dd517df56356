#include "gpt2p/core/isolated.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <sstream>
#include <thread>

namespace gpt2p {

std::string IsolatedRun::describe(double timeout_s) const {
  std::ostringstream os;
  switch (kind) {
    case Kind::kFinished: os << "finished"; break;
    case Kind::kSignal:
      os << "crashed (signal " << signal << ": " << ::strsignal(signal) << ")";
      break;
    case Kind::kExitCode: os << "exited with status " << exit_code; break;
    case Kind::kTimedOut: os << "ran for more than " << timeout_s << " s"; break;
    case Kind::kNoFork: os << "could not be started (fork: " << std::strerror(error) << ")"; break;
  }
  return os.str();
}

IsolatedRun run_isolated(const std::function<void()>& fn, double timeout_s) {
  IsolatedRun run;
  const pid_t pid = ::fork();
  if (pid < 0) {
    run.kind = IsolatedRun::Kind::kNoFork;
    run.error = errno;
    return run;
  }
  if (pid == 0) {
    // A crash ends the child quietly: handlers installed for the parent (Open MPI prints a
    // backtrace on SIGSEGV) would report it as the program's own.
    for (const int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) ::signal(sig, SIG_DFL);
    try {
      fn();
    } catch (...) {  // the parent meets the same exception when it runs fn itself
    }
    ::_exit(0);
  }
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  auto pause = std::chrono::microseconds(200);
  int status = 0;
  for (;;) {
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (done < 0 && errno != EINTR) {  // reaped elsewhere: nothing more can be known
      return run;
    }
    if (Clock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      run.kind = IsolatedRun::Kind::kTimedOut;
      return run;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(20000));
  }
  if (WIFSIGNALED(status)) {
    run.kind = IsolatedRun::Kind::kSignal;
    run.signal = WTERMSIG(status);
  } else if (WIFEXITED(status) && WEXITSTATUS(status) != 0) {
    run.kind = IsolatedRun::Kind::kExitCode;
    run.exit_code = WEXITSTATUS(status);
  }
  return run;
}

}  // namespace gpt2p
