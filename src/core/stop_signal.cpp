#include "gpt2p/core/stop_signal.h"

#include <pthread.h>

#include <csignal>
#include <string>

namespace gpt2p {
namespace {

volatile std::sig_atomic_t g_received = 0;
struct sigaction g_previous_term {};
struct sigaction g_previous_int {};
struct sigaction g_previous_usr1 {};

extern "C" void on_stop_signal(int signal) {
  g_received = signal;
  // The next SIGTERM or SIGINT takes the default action: a user can still force an end. SIGUSR1
  // is a launcher's request, which may reach a rank twice (from mpirun and from the job script):
  // it stays caught.
  if (signal != SIGUSR1) std::signal(signal, SIG_DFL);
}

void install(int signal, struct sigaction* previous) {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(signal, &action, previous);
}

}  // namespace

StopSignals::StopSignals() {
  g_received = 0;
  install(SIGTERM, &g_previous_term);
  install(SIGINT, &g_previous_int);
  install(SIGUSR1, &g_previous_usr1);
}

StopSignals::~StopSignals() {
  sigaction(SIGTERM, &g_previous_term, nullptr);
  sigaction(SIGINT, &g_previous_int, nullptr);
  sigaction(SIGUSR1, &g_previous_usr1, nullptr);
}

int StopSignals::received() { return g_received; }

std::string StopSignals::reclaim() {
  std::string taken;
  const auto note = [&](int signal, const char* what) {
    taken += std::string(taken.empty() ? "" : ", ") + signal_name(signal) + " (" + what + ")";
  };
  sigset_t blocked;
  sigemptyset(&blocked);
  pthread_sigmask(SIG_BLOCK, nullptr, &blocked);
  for (const int signal : {SIGTERM, SIGINT, SIGUSR1}) {
    struct sigaction now {};
    sigaction(signal, nullptr, &now);
    // After the first signal of a kind the handler itself puts SIG_DFL back (a second one ends
    // the process): that is ours, not a change.
    const bool ours =
        (now.sa_flags & SA_SIGINFO) == 0 &&
        (now.sa_handler == on_stop_signal || (now.sa_handler == SIG_DFL && g_received == signal));
    if (!ours) {
      install(signal, nullptr);
      note(signal, "handler replaced");
    }
    if (sigismember(&blocked, signal) == 1) {
      sigset_t one;
      sigemptyset(&one);
      sigaddset(&one, signal);
      pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
      note(signal, "blocked");
    }
  }
  return taken;
}

const char* signal_name(int signal) {
  switch (signal) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGUSR1: return "SIGUSR1";
    default: {
      static thread_local std::string text;
      text = "signal " + std::to_string(signal);
      return text.c_str();
    }
  }
}

}  // namespace gpt2p
