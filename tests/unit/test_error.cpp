// The error checks (core/error.h), without MPI initialised: message format and process label.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>
#include <string>

#include "gpt2p/cli/main_guard.h"
#include "gpt2p/core/error.h"

namespace gpt2p {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// The Error thrown by f; fails the test when f throws nothing.
template <class F>
Error caught(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "expected a gpt2p::Error";
  return Error("", "", "", 0);
}

TEST(Error, CheckMessageNamesWhereWhatAndFix) {
  const int batch = 10;
  const int world = 3;
  const int line = __LINE__ + 2;
  const Error e = caught([&] {
    GPT2P_CHECK(batch % world == 0,
                "batch " << batch << " does not divide over " << world << " ranks",
                "pass --batch-size as a multiple of " << world);
  });
  const std::string msg = e.what();
  EXPECT_THAT(msg, StartsWith("[rank ? on "));
  EXPECT_THAT(msg, HasSubstr("test_error.cpp:" + std::to_string(line) + ": "));
  EXPECT_THAT(msg,
              HasSubstr(": batch 10 does not divide over 3 ranks -- fix: pass --batch-size as a "
                        "multiple of 3"));
  EXPECT_EQ(e.what_happened(), "batch 10 does not divide over 3 ranks");
  EXPECT_EQ(e.hint(), "pass --batch-size as a multiple of 3");
}

TEST(Error, PassingCheckDoesNotEvaluateTheMessage) {
  int evaluated = 0;
  auto count = [&] { return ++evaluated; };
  auto passing = [&] { GPT2P_CHECK(1 + 1 == 2, "never " << count(), "never " << count()); };
  EXPECT_NO_THROW(passing());
  EXPECT_EQ(evaluated, 0);
}

TEST(Error, FailWithoutHintHasNoFixPart) {
  const Error e = caught([] { GPT2P_FAIL("plain failure", ""); });
  EXPECT_THAT(e.what(), HasSubstr("plain failure"));
  EXPECT_THAT(e.what(), Not(HasSubstr("fix:")));
}

TEST(Error, ErrorIsARuntimeError) {
  auto failing = [] { GPT2P_FAIL("x", "y"); };
  EXPECT_THROW(failing(), std::runtime_error);
}

TEST(Error, ProcessLabelBeforeMpiInitSaysRankUnknown) {
  int initialized = 1;
  MPI_Initialized(&initialized);
  ASSERT_EQ(initialized, 0) << "this test binary must not initialise MPI";
  EXPECT_THAT(process_label(), StartsWith("rank ? on "));
  EXPECT_GT(process_label().size(), std::string("rank ? on ").size());  // the host name follows
}

// Only the success path: OpenMPI aborts the process when MPI_Error_string runs before MPI_Init, so
// the failure text of GPT2P_MPI_CHECK is covered by the MPI tests (tests/mpi), not here.
TEST(Error, MpiCheckPassesSuccess) {
  int calls = 0;
  auto ok = [&] {
    ++calls;
    return MPI_SUCCESS;
  };
  EXPECT_NO_THROW(GPT2P_MPI_CHECK(ok()));
  EXPECT_EQ(calls, 1);  // the call is made exactly once
}

TEST(ErrorMessage, TorchsBacktraceIsCutAndOutOfMemoryGetsTheFix) {
  const std::string torch_oom =
      "CUDA out of memory. Tried to allocate 150.00 MiB. GPU 0 has a total capacity of 139.80 GiB\n"
      "Exception raised from malloc at /pytorch/c10/cuda/CUDACachingAllocator.cpp:1412 (most "
      "recent call first):\nframe #0: c10::Error::Error(c10::SourceLocation) + 0x9d\n";
  const auto m = gpt2p::cli::error_message(torch_oom);
  EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  EXPECT_EQ(m.find("frame #"), std::string::npos) << m;
  EXPECT_THAT(m, ::testing::StartsWith("CUDA out of memory. Tried to allocate 150.00 MiB."));
  EXPECT_THAT(m, ::testing::HasSubstr("-- fix: use less memory per rank: a smaller --batch-size"));
  EXPECT_THAT(m, ::testing::HasSubstr("--recompute blocks"));
  // Our own errors pass unchanged, their fix included.
  EXPECT_EQ(gpt2p::cli::error_message("no such file -- fix: pass --data"),
            "no such file -- fix: pass --data");
}

// gpt2p::fatal: the installed handler ends the process; without one the message goes to stderr
// and the process exits 1 (no MPI here).
void exit_with_three(const Error&) { std::_Exit(3); }

TEST(FatalDeathTest, TheInstalledHandlerEndsTheProcess) {
  EXPECT_EXIT(
      {
        set_fatal_handler(&exit_with_three);
        fatal(Error("watched operation late", "look at the peers", "w.cpp", 7));
      },
      ::testing::ExitedWithCode(3), "");
}

TEST(FatalDeathTest, WithoutAHandlerItPrintsTheErrorAndExitsOne) {
  EXPECT_EXIT(
      {
        set_fatal_handler(nullptr);
        fatal(Error("watched operation late", "look at the peers", "w.cpp", 7));
      },
      ::testing::ExitedWithCode(1),
      "error: .*w.cpp:7: watched operation late -- fix: look at the peers");
}

}  // namespace
}  // namespace gpt2p
