// Writing files so that nothing is ever half-written: write to "<path>.tmp.<pid>", then rename.
//
// Every write, fsync and close is checked: a full disk (ENOSPC, EDQUOT), a read-only file system
// (EROFS) or a permission problem (EACCES, EPERM) becomes a FileError that says which, names the
// file and how to fix it, and the temporary is removed.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

#include "gpt2p/core/error.h"

namespace gpt2p {

// A failed file system call; error_number() is its errno (ENOSPC, EROFS, EACCES, ...).
class FileError : public Error {
 public:
  FileError(int error_number, std::string what, std::string hint, const char* file, int line);
  int error_number() const { return errno_; }

 private:
  int errno_;
};

// "no space left on device", "read-only file system", "permission denied", ... for an errno.
std::string describe_errno(int error_number);

// Throws a FileError for `error_number`: "<description> <doing> <path>" with a fix that suits it
// (free disk space / write to a writable directory / check the disk).
[[noreturn]] void throw_file_error(int error_number, const std::string& doing,
                                   const std::string& path);

// A file opened for writing (created or truncated) whose every write, fsync and close is checked.
// Writes go straight to the file descriptor (no buffering of its own).
class FileWriter {
 public:
  explicit FileWriter(const std::string& path);
  ~FileWriter();  // closes without checks when close() was not reached (an error is on its way)
  FileWriter(const FileWriter&) = delete;
  FileWriter& operator=(const FileWriter&) = delete;

  void write(const void* data, size_t n);
  void write(const std::string& bytes) { write(bytes.data(), bytes.size()); }
  // fsync, then close: only then are the bytes known to be on disk.
  void close();

  const std::string& path() const { return path_; }
  size_t bytes_written() const { return written_; }

 private:
  std::string path_;
  int fd_ = -1;
  size_t written_ = 0;
};

// Calls `write(tmp_path)`, then renames tmp_path over `path`. On any exception the temporary is
// removed and the exception propagates; `path` is either the old file or the complete new one.
// The new file and its directory are fsynced, so the rename survives a crash.
void write_atomically(const std::string& path,
                      const std::function<void(const std::string&)>& write);

// Same, with a checked FileWriter on the temporary (closed, i.e. fsynced, before the rename).
void write_file_atomically(const std::string& path, const std::function<void(FileWriter&)>& write);

// The whole byte content, atomically and checked.
void write_bytes_atomically(const std::string& path, const std::string& bytes);

// Convenience: the whole text content, atomically and checked.
void write_text_atomically(const std::string& path, const std::string& content);

// Makes the complete directory `staged` the new `dir` in one rename: a previous `dir` is moved to
// "<dir>.old.<pid>", `staged` renamed to `dir`, the parent directory fsynced, and the old one
// removed. When the rename fails the previous `dir` is put back and a FileError propagates.
// `staged` must be on the same file system as `dir` (e.g. "<dir>.tmp.<pid>").
void replace_dir(const std::string& staged, const std::string& dir);

// Same, for a whole directory (checkpoints): `write(tmp_dir)` fills a fresh temporary directory,
// which then replaces `dir` through replace_dir (the previous one is removed only after the new
// one is in place). On any exception the temporary directory is removed and `dir` is untouched.
// After a success it also removes "<dir>.tmp.<pid>" and "<dir>.old.<pid>" of processes that no
// longer run on this host (a save killed midway).
void write_dir_atomically(const std::string& dir,
                          const std::function<void(const std::string&)>& write);

// fsync of a directory (its entries: created, renamed and removed files). Throws a FileError.
void fsync_dir(const std::string& dir);

// Removes `path` and, for a directory, everything below it (symbolic links are removed, not
// followed). True when nothing is left at `path` (also when there was nothing); errno tells why
// not. Use this, not std::filesystem::remove_all: PyTorch's wheels (2.5 and later) export their own
// statically linked copy of libstdc++'s std::filesystem, which then shadows the system one in any
// program linking libtorch, and its directory iteration crashed there with GCC 13 headers
// (pytorch/pytorch#133437; seen as a segfault after a checkpoint replaced the previous one).
bool remove_tree(const std::string& path);

}  // namespace gpt2p
