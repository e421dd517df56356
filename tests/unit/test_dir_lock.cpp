// One job per output directory: the lock, its holder's line, and its release.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "gpt2p/core/dir_lock.h"
#include "gpt2p/core/error.h"
#include "support/temp_dir.h"

namespace gpt2p {
namespace {

using Outcome = DirLock::Outcome;

TEST(DirLock, HoldsRefusesASecondAndNamesTheHolder) {
  testing::TempDir dir("dir_lock");
  Outcome first{}, second{};
  std::string detail;
  auto lock = DirLock::acquire(dir.str(), "dp_train", first, detail);
  ASSERT_EQ(first, Outcome::kHeld);
  ASSERT_NE(lock, nullptr);
  // flock belongs to the open file: a second open in this very process is refused as another
  // job's would be.
  auto again = DirLock::acquire(dir.str(), "pp_train", second, detail);
  EXPECT_EQ(second, Outcome::kBusy);
  EXPECT_EQ(again, nullptr);
  EXPECT_NE(detail.find("dp_train (pid " + std::to_string(::getpid()) + " on "), std::string::npos)
      << detail;
  EXPECT_NE(detail.find(", since 20"), std::string::npos) << detail;
}

TEST(DirLock, ReleaseRemovesTheFileAndFreesTheDirectory) {
  testing::TempDir dir("dir_lock");
  Outcome o{};
  std::string detail;
  {
    auto lock = DirLock::acquire(dir.str(), "dp_train", o, detail);
    ASSERT_EQ(o, Outcome::kHeld);
    EXPECT_TRUE(std::filesystem::exists(dir / DirLock::kFileName));
  }
  EXPECT_FALSE(std::filesystem::exists(dir / DirLock::kFileName));
  auto lock = DirLock::acquire(dir.str(), "pp_train", o, detail);
  EXPECT_EQ(o, Outcome::kHeld);
}

TEST(DirLock, AKilledHolderLeavesNoStaleLock) {
  testing::TempDir dir("dir_lock");
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    Outcome o{};
    std::string detail;
    auto lock = DirLock::acquire(dir.str(), "dp_train", o, detail);
    const char c = o == Outcome::kHeld ? 'y' : 'n';
    if (::write(ready[1], &c, 1) != 1) ::_exit(1);
    ::pause();  // killed below, lock held
    ::_exit(0);
  }
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ASSERT_EQ(c, 'y');
  Outcome o{};
  std::string detail;
  EXPECT_EQ(DirLock::acquire(dir.str(), "pp_train", o, detail), nullptr);
  EXPECT_EQ(o, Outcome::kBusy);
  EXPECT_NE(detail.find("dp_train (pid " + std::to_string(child)), std::string::npos) << detail;
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  // The file is still there (nobody removed it), but nobody holds it.
  EXPECT_TRUE(std::filesystem::exists(dir / DirLock::kFileName));
  auto lock = DirLock::acquire(dir.str(), "pp_train", o, detail);
  EXPECT_EQ(o, Outcome::kHeld);
  std::ifstream in(dir / DirLock::kFileName);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_NE(text.str().find("pp_train (pid " + std::to_string(::getpid())), std::string::npos);
  ::close(ready[0]);
  ::close(ready[1]);
}

TEST(DirLock, AMissingDirectoryIsAFileError) {
  Outcome o{};
  std::string detail;
  EXPECT_THROW(DirLock::acquire("/nonexistent-gpt2p-dir/x", "dp_train", o, detail), Error);
}

}  // namespace
}  // namespace gpt2p
