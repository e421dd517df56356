// core/isolated.h: work run in a child process, whose crash, hang or exit does not reach the
// caller.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <thread>

#include "gpt2p/core/error.h"
#include "gpt2p/core/isolated.h"

namespace gpt2p {
namespace {

using Kind = IsolatedRun::Kind;

TEST(Isolated, WorkThatReturnsOrThrowsFinishes) {
  int touched = 0;
  EXPECT_TRUE(run_isolated([&] { touched = 1; }, 10).finished());
  EXPECT_EQ(touched, 0);  // the child's memory is its own
  EXPECT_TRUE(run_isolated([] { throw std::runtime_error("refused"); }, 10).finished());
  EXPECT_TRUE(run_isolated([] { GPT2P_FAIL("a damaged file", "re-create it"); }, 10).finished());
}

TEST(Isolated, ACrashIsReportedNotSuffered) {
  const IsolatedRun run = run_isolated([] { ::raise(SIGSEGV); }, 10);
  EXPECT_EQ(run.kind, Kind::kSignal);
  EXPECT_EQ(run.signal, SIGSEGV);
  EXPECT_NE(run.describe(10).find("crashed (signal 11: "), std::string::npos) << run.describe(10);
  const IsolatedRun aborted = run_isolated([] { std::abort(); }, 10);
  EXPECT_EQ(aborted.kind, Kind::kSignal);
  EXPECT_EQ(aborted.signal, SIGABRT);
}

TEST(Isolated, AnExitInsideTheWorkIsItsStatus) {
  const IsolatedRun run = run_isolated([] { ::_exit(3); }, 10);
  EXPECT_EQ(run.kind, Kind::kExitCode);
  EXPECT_EQ(run.exit_code, 3);
  EXPECT_EQ(run.describe(10), "exited with status 3");
}

TEST(Isolated, WorkThatHangsIsKilledAtTheTimeout) {
  const auto start = std::chrono::steady_clock::now();
  const IsolatedRun run = run_isolated(
      [] {
        for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
      },
      0.3);
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(run.kind, Kind::kTimedOut);
  EXPECT_EQ(run.describe(0.3), "ran for more than 0.3 s");
  EXPECT_LT(took, 5.0);  // killed, not waited for
}

}  // namespace
}  // namespace gpt2p
