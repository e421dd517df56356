// Atomic writes (files and checkpoint directories) and remove_tree.
#include "gpt2p/core/atomic_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "gpt2p/core/error.h"
#include "support/temp_dir.h"

namespace gpt2p {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(RemoveTree, RemovesNestedDirectoriesButNotWhatLinksPointTo) {
  TempDir dir("rmtree");
  fs::create_directories(dir / "a/b/c");
  write_text_atomically(dir / "a/b/c/file", "x");
  write_text_atomically(dir / "outside", "keep me");
  fs::create_symlink(dir / "outside", dir / "a/link");
  fs::create_directory_symlink(dir.path(), dir / "a/b/loop");  // must not be followed

  EXPECT_TRUE(remove_tree(dir / "a"));
  EXPECT_FALSE(fs::exists(dir / "a"));
  EXPECT_EQ(slurp(dir / "outside"), "keep me");
  EXPECT_TRUE(remove_tree(dir / "a")) << "nothing there counts as removed";
  EXPECT_TRUE(remove_tree(dir / "outside"));  // plain files too
  EXPECT_FALSE(fs::exists(dir / "outside"));
}

TEST(AtomicFile, ReplacesTheFileOrLeavesItUntouched) {
  TempDir dir("atomic");
  write_text_atomically(dir / "f.txt", "one");
  write_text_atomically(dir / "f.txt", "two");
  EXPECT_EQ(slurp(dir / "f.txt"), "two");
  EXPECT_THROW(write_atomically(dir / "f.txt",
                                [](const std::string& tmp) {
                                  std::ofstream(tmp) << "half";
                                  throw std::runtime_error("disk full");
                                }),
               std::runtime_error);
  EXPECT_EQ(slurp(dir / "f.txt"), "two");
  EXPECT_EQ(dir.entries(), 1) << "the temporary file must be gone";
}

TEST(AtomicDir, SecondWriteReplacesTheFirstAndLeavesNothingBehind) {
  // What a run does at every --save-every: the second save replaces a full directory. This is
  // where the GPU build crashed (std::filesystem::remove_all from PyTorch's wheel).
  TempDir dir("atomic_dir");
  const std::string ckpt = dir / "checkpoint";
  for (const char* text : {"first", "second"}) {
    write_dir_atomically(ckpt, [&](const std::string& tmp) {
      fs::create_directories(tmp + "/sub");
      write_text_atomically(tmp + "/sub/weights", text);
    });
  }
  EXPECT_EQ(slurp(ckpt + "/sub/weights"), "second");
  EXPECT_EQ(dir.entries(), 1) << "no <checkpoint>.old.* or .tmp.* may be left";
}

TEST(AtomicDir, FailedWriteKeepsThePreviousDirectory) {
  TempDir dir("atomic_dir_fail");
  const std::string ckpt = dir / "checkpoint";
  write_dir_atomically(ckpt, [](const std::string& tmp) { write_text_atomically(tmp + "/w", "ok"); });
  EXPECT_THROW(write_dir_atomically(ckpt,
                                    [](const std::string& tmp) {
                                      write_text_atomically(tmp + "/w", "half");
                                      GPT2P_FAIL("interrupted", "-");
                                    }),
               Error);
  EXPECT_EQ(slurp(ckpt + "/w"), "ok");
  EXPECT_EQ(dir.entries(), 1);
}

}  // namespace
}  // namespace gpt2p
