// Atomic writes (files and checkpoint directories) and remove_tree.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "gpt2p/core/atomic_file.h"
#include "gpt2p/core/error.h"
#include "support/temp_dir.h"
#include "support/tmpfs.h"

namespace gpt2p {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;
using testing::Tmpfs;

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The message and fix of the FileError that `f` throws, and its errno.
struct Caught {
  std::string what;
  std::string hint;
  int error_number = 0;
};
Caught file_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const FileError& e) {
    return {e.what(), e.hint(), e.error_number()};
  }
  return {"(no FileError)", "", 0};
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

// A save killed midway leaves "<checkpoint>.tmp.<pid>"; the next save removes it, but not the
// temporary of a process that still runs.
TEST(AtomicDir, ASaveRemovesWhatAKilledSaveLeftButNotALiveOnes) {
  TempDir dir("atomic_dir_stale");
  const std::string ckpt = dir / "checkpoint";
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ASSERT_GT(dead, 0);
  ::waitpid(dead, nullptr, 0);  // reaped: no process has this pid now
  const std::string stale_tmp = ckpt + ".tmp." + std::to_string(dead);
  const std::string stale_old = ckpt + ".old." + std::to_string(dead);
  const std::string live_tmp = ckpt + ".tmp." + std::to_string(::getppid());
  for (const auto& d : {stale_tmp, stale_old, live_tmp}) {
    fs::create_directories(d + "/sub");
    write_text_atomically(d + "/sub/weights", "partial");
  }
  write_dir_atomically(ckpt,
                       [&](const std::string& tmp) { write_text_atomically(tmp + "/w", "new"); });
  EXPECT_FALSE(fs::exists(stale_tmp));
  EXPECT_FALSE(fs::exists(stale_old));
  EXPECT_TRUE(fs::exists(live_tmp)) << "another process's save may still be running";
  EXPECT_EQ(slurp(ckpt + "/w"), "new");
}

TEST(AtomicDir, FailedWriteKeepsThePreviousDirectory) {
  TempDir dir("atomic_dir_fail");
  const std::string ckpt = dir / "checkpoint";
  write_dir_atomically(ckpt,
                       [](const std::string& tmp) { write_text_atomically(tmp + "/w", "ok"); });
  EXPECT_THROW(write_dir_atomically(ckpt,
                                    [](const std::string& tmp) {
                                      write_text_atomically(tmp + "/w", "half");
                                      GPT2P_FAIL("interrupted", "-");
                                    }),
               Error);
  EXPECT_EQ(slurp(ckpt + "/w"), "ok");
  EXPECT_EQ(dir.entries(), 1);
}

TEST(FileWriter, DevFullIsNoSpaceLeftOnDeviceNamingTheFile) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full here";
  const std::string block(1 << 16, 'x');
  const auto e = file_error_of([&] {
    FileWriter out("/dev/full");
    out.write(block);
    out.close();
  });
  EXPECT_EQ(e.error_number, ENOSPC) << e.what;
  EXPECT_NE(e.what.find("no space left on device writing /dev/full"), std::string::npos) << e.what;
  EXPECT_NE(e.hint.find("free disk space"), std::string::npos) << e.hint;
}

TEST(FileWriter, MissingDirectoryNamesThePath) {
  TempDir dir("writer");
  const auto e = file_error_of([&] { FileWriter out(dir / "no/such/dir/f"); });
  EXPECT_EQ(e.error_number, ENOENT) << e.what;
  EXPECT_NE(e.what.find(dir / "no/such/dir/f"), std::string::npos) << e.what;
}

TEST(AtomicFile, FullFileSystemKeepsTheOldFileAndLeavesNoTemporary) {
  Tmpfs tmpfs("size=64k");
  if (!tmpfs.mounted()) GTEST_SKIP() << "cannot mount a tmpfs: " << tmpfs.error();
  const std::string path = tmpfs / "f.bin";
  write_bytes_atomically(path, "old");
  const auto e = file_error_of([&] { write_bytes_atomically(path, std::string(1 << 20, 'y')); });
  EXPECT_EQ(e.error_number, ENOSPC) << e.what;
  EXPECT_NE(e.what.find("no space left on device writing " + path + ".tmp."), std::string::npos)
      << e.what;
  EXPECT_NE(e.hint.find("free disk space"), std::string::npos) << e.hint;
  EXPECT_EQ(slurp(path), "old");
  EXPECT_EQ(tmpfs.entries(), 1) << "the temporary file must be gone";
  // The same through write_text_atomically (meta.json, config files).
  EXPECT_EQ(
      file_error_of([&] { write_text_atomically(path, std::string(1 << 20, 'z')); }).error_number,
      ENOSPC);
  EXPECT_EQ(slurp(path), "old");
}

TEST(AtomicFile, ReadOnlyFileSystemSaysSoInsteadOfDiskSpace) {
  Tmpfs tmpfs("size=64k", MS_RDONLY);
  if (!tmpfs.mounted()) GTEST_SKIP() << "cannot mount a tmpfs: " << tmpfs.error();
  const auto e = file_error_of([&] { write_text_atomically(tmpfs / "f.txt", "x"); });
  EXPECT_EQ(e.error_number, EROFS) << e.what;
  EXPECT_NE(e.what.find("read-only file system"), std::string::npos) << e.what;
  EXPECT_NE(e.what.find(tmpfs / "f.txt"), std::string::npos) << e.what;
  EXPECT_NE(e.hint.find("writable directory"), std::string::npos) << e.hint;
  EXPECT_EQ(e.hint.find("disk space"), std::string::npos) << e.hint;
  // A checkpoint-like directory below it: the same error, from creating the temporary directory.
  const auto d = file_error_of([&] {
    write_dir_atomically(tmpfs / "ckpt",
                         [](const std::string& tmp) { write_text_atomically(tmp + "/w", "x"); });
  });
  EXPECT_EQ(d.error_number, EROFS) << d.what;
}

TEST(ReplaceDir, StagedDirectoryBecomesTheNewOneInOneRename) {
  TempDir dir("replace_dir");
  const std::string ckpt = dir / "ckpt";
  for (const char* text : {"one", "two"}) {
    const std::string staged = dir / "staged";
    fs::create_directories(staged + "/stage0");
    write_text_atomically(staged + "/stage0/w", text);
    write_text_atomically(staged + "/manifest.json", "{}");
    replace_dir(staged, ckpt);
    EXPECT_FALSE(fs::exists(staged));
    EXPECT_EQ(slurp(ckpt + "/stage0/w"), text);
  }
  EXPECT_EQ(dir.entries(), 1) << "no ckpt.old.* may be left";
  // A trailing slash names the same directory (the old one is not moved inside itself).
  fs::create_directories(dir / "staged");
  write_text_atomically(dir / "staged/w", "three");
  replace_dir(dir / "staged/", ckpt + "/");
  EXPECT_EQ(slurp(ckpt + "/w"), "three");
  EXPECT_EQ(dir.entries(), 1);
}

TEST(ReplaceDir, FailedRenameRestoresThePreviousDirectory) {
  TempDir dir("replace_dir_fail");
  const std::string ckpt = dir / "ckpt";
  write_dir_atomically(ckpt,
                       [](const std::string& tmp) { write_text_atomically(tmp + "/w", "ok"); });
  // Not a directory: refused before anything moves.
  write_text_atomically(dir / "file", "x");
  EXPECT_THROW(replace_dir(dir / "file", ckpt), Error);
  EXPECT_EQ(slurp(ckpt + "/w"), "ok");
  // A directory cannot be renamed into itself (EINVAL): the rename fails after the previous one
  // was moved aside, and it must come back.
  fs::create_directories(ckpt + "/inner");
  write_text_atomically(ckpt + "/inner/w", "inner");
  const auto e = file_error_of([&] { replace_dir(ckpt, ckpt + "/inner"); });
  EXPECT_EQ(e.error_number, EINVAL) << e.what;
  EXPECT_EQ(slurp(ckpt + "/inner/w"), "inner");
  EXPECT_EQ(slurp(ckpt + "/w"), "ok");
  EXPECT_EQ(dir.entries(), 2) << "ckpt and file only";
}

}  // namespace
}  // namespace gpt2p
