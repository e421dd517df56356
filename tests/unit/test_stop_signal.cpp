#include <gtest/gtest.h>
#include <pthread.h>

#include <csignal>

#include "gpt2p/core/stop_signal.h"

namespace gpt2p {
namespace {

TEST(StopSignals, NothingToReclaimRightAfterConstruction) {
  const StopSignals signals;
  EXPECT_EQ(StopSignals::reclaim(), "");
  EXPECT_EQ(StopSignals::received(), 0);
}

TEST(StopSignals, AReplacedHandlerIsTakenBackAndThenCatchesTheSignal) {
  const StopSignals signals;
  std::signal(SIGUSR1, SIG_IGN);  // what a library might do after start-up
  EXPECT_EQ(StopSignals::reclaim(), "SIGUSR1 (handler replaced)");
  EXPECT_EQ(StopSignals::reclaim(), "");
  std::raise(SIGUSR1);
  EXPECT_EQ(StopSignals::received(), SIGUSR1);
}

TEST(StopSignals, ABlockedSignalIsUnblockedAndDelivered) {
  const StopSignals signals;
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::raise(SIGTERM);  // pending while blocked
  EXPECT_EQ(StopSignals::received(), 0);
  EXPECT_EQ(StopSignals::reclaim(), "SIGTERM (blocked), SIGINT (blocked)");
  EXPECT_EQ(StopSignals::received(), SIGTERM);  // delivered as soon as it was unblocked
  sigset_t now;
  pthread_sigmask(SIG_BLOCK, nullptr, &now);
  EXPECT_EQ(sigismember(&now, SIGTERM), 0);
}

TEST(StopSignals, TheDefaultActionAfterAFirstSignalIsNotAChange) {
  const StopSignals signals;
  std::raise(SIGINT);  // the handler puts SIG_DFL back, so that a second one ends the process
  EXPECT_EQ(StopSignals::received(), SIGINT);
  EXPECT_EQ(StopSignals::reclaim(), "");
}

TEST(StopSignals, ASecondSigusr1IsCaughtToo) {
  const StopSignals signals;
  std::raise(SIGUSR1);
  std::raise(SIGUSR1);  // mpirun's and the job script's: the process lives on
  EXPECT_EQ(StopSignals::received(), SIGUSR1);
  EXPECT_EQ(StopSignals::reclaim(), "");
}

TEST(StopSignals, TheHandlersBeforeComeBackOnDestruction) {
  std::signal(SIGUSR1, SIG_IGN);
  { const StopSignals signals; }
  struct sigaction now {};
  sigaction(SIGUSR1, nullptr, &now);
  EXPECT_EQ(now.sa_handler, SIG_IGN);
  std::signal(SIGUSR1, SIG_DFL);
}

}  // namespace
}  // namespace gpt2p
