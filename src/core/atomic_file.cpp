#include "gpt2p/core/atomic_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace gpt2p {

namespace {
std::string temp_name(const std::string& path) {
  return path + ".tmp." + std::to_string(::getpid());
}

int remove_entry(const char* path, const struct stat* /*st*/, int /*flag*/, struct FTW* /*ftw*/) {
  return std::remove(path) == 0 || errno == ENOENT ? 0 : -1;
}

// "a/b/" -> "a/b" (a trailing slash would put "<dir>.old.<pid>" inside dir).
std::string strip_slashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

std::string parent_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

bool is_dir(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

// mkdir -p, checked.
void make_dirs(const std::string& path) {
  if (path.empty() || is_dir(path)) return;
  const std::string parent = parent_of(path);
  if (parent != path) make_dirs(parent);
  if (::mkdir(path.c_str(), 0777) != 0 && !(errno == EEXIST && is_dir(path))) {
    throw_file_error(errno, "creating directory", path);
  }
}

// fsync of an existing file by name (what a callback of write_atomically wrote).
void fsync_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;  // the rename that follows reports a missing file
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0 && err != EINVAL) throw_file_error(err, "syncing", path);
}

void rename_checked(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    const int err = errno;
    const std::string desc = describe_errno(err);
    if (err == EXDEV) {
      throw FileError(err, "cannot rename " + from + " to " + to + ": " + desc,
                      "write the temporary next to its destination (one file system)", __FILE__,
                      __LINE__);
    }
    throw_file_error(err, "renaming " + from + " to", to);
  }
}
}  // namespace

FileError::FileError(int error_number, std::string what, std::string hint, const char* file,
                     int line)
    : Error(std::move(what), std::move(hint), file, line), errno_(error_number) {}

std::string describe_errno(int error_number) {
  switch (error_number) {
    case ENOSPC: return "no space left on device";
    case EDQUOT: return "disk quota exceeded";
    case EROFS: return "read-only file system";
    case EACCES:
    case EPERM: return "permission denied";
    default: return std::strerror(error_number);
  }
}

void throw_file_error(int error_number, const std::string& doing, const std::string& path) {
  std::string hint;
  switch (error_number) {
    case ENOSPC:
    case EDQUOT: hint = "free disk space or write to another file system"; break;
    case EROFS: hint = "the file system is mounted read-only: write to a writable directory"; break;
    case EACCES:
    case EPERM:
      hint = "make the directory writable for this user or write to another directory";
      break;
    case EIO: hint = "the disk reports I/O errors: check it (dmesg) and write elsewhere"; break;
    default: hint = "check the path, its permissions and the disk"; break;
  }
  throw FileError(error_number, describe_errno(error_number) + " " + doing + " " + path, hint,
                  __FILE__, __LINE__);
}

FileWriter::FileWriter(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd_ < 0) throw_file_error(errno, "opening for writing", path);
}

FileWriter::~FileWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void FileWriter::write(const void* data, size_t n) {
  GPT2P_CHECK(fd_ >= 0, "writing " << path_ << " after it was closed",
              "this is a bug in the caller: write everything before close()");
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t got = ::write(fd_, p, n);
    if (got < 0) {
      if (errno == EINTR) continue;
      throw_file_error(errno, "writing", path_);
    }
    if (got == 0) throw_file_error(ENOSPC, "writing", path_);
    p += got;
    n -= static_cast<size_t>(got);
    written_ += static_cast<size_t>(got);
  }
}

void FileWriter::close() {
  if (fd_ < 0) return;
  const int fd = fd_;
  fd_ = -1;
  // EINVAL: a special file (e.g. /dev/full) that cannot be synced.
  if (::fsync(fd) != 0 && errno != EINVAL) {
    const int err = errno;
    ::close(fd);
    throw_file_error(err, "syncing", path_);
  }
  if (::close(fd) != 0 && errno != EINTR) throw_file_error(errno, "closing", path_);
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  // A directory we may write but not read cannot be opened to sync it: nothing more to do.
  if (fd < 0 && (errno == EACCES || errno == EPERM)) return;
  if (fd < 0) throw_file_error(errno, "opening directory", dir);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0 && err != EINVAL) throw_file_error(err, "syncing directory", dir);
}

bool remove_tree(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return errno == ENOENT;
  // Depth first (children before their directory), never following symbolic links.
  return ::nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS) == 0;
}

void write_atomically(const std::string& path,
                      const std::function<void(const std::string&)>& write) {
  const std::string parent = parent_of(path);
  make_dirs(parent);
  const std::string tmp = temp_name(path);
  try {
    write(tmp);
    fsync_file(tmp);
    rename_checked(tmp, path);
  } catch (...) {
    remove_tree(tmp);
    throw;
  }
  fsync_dir(parent);
}

void write_file_atomically(const std::string& path, const std::function<void(FileWriter&)>& write) {
  write_atomically(path, [&](const std::string& tmp) {
    FileWriter out(tmp);
    write(out);
    out.close();
  });
}

void write_bytes_atomically(const std::string& path, const std::string& bytes) {
  write_file_atomically(path, [&](FileWriter& out) { out.write(bytes); });
}

void write_text_atomically(const std::string& path, const std::string& content) {
  write_bytes_atomically(path, content);
}

void replace_dir(const std::string& staged_in, const std::string& dir_in) {
  const std::string staged = strip_slashes(staged_in);
  const std::string dir = strip_slashes(dir_in);
  GPT2P_CHECK(is_dir(staged),
              "cannot make " << staged << " the new " << dir << ": it is not a directory",
              "stage the complete directory first (e.g. as " << temp_name(dir) << ")");
  const std::string parent = parent_of(dir);
  const std::string old = dir + ".old." + std::to_string(::getpid());
  const bool had_old = exists(dir);
  if (had_old &&
      ::renameat2(AT_FDCWD, staged.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0) {
    // One atomic swap: there is no moment without a complete `dir`; `staged` now holds the
    // previous one.
    fsync_dir(parent);
    GPT2P_CHECK(remove_tree(staged),
                "cannot remove the previous " << dir << " (kept as " << staged
                                              << "): " << std::strerror(errno),
                "remove it by hand; the new " << dir << " is complete");
    return;
  }
  // File systems without RENAME_EXCHANGE: two renames, the previous one kept aside in between.
  if (had_old) {
    GPT2P_CHECK(remove_tree(old), "cannot remove the stale " << old << ": " << std::strerror(errno),
                "remove it by hand");
    rename_checked(dir, old);
  }
  try {
    rename_checked(staged, dir);
  } catch (...) {
    if (had_old) ::rename(old.c_str(), dir.c_str());  // put the previous one back
    throw;
  }
  fsync_dir(parent);
  if (had_old) {
    GPT2P_CHECK(remove_tree(old),
                "cannot remove the previous " << dir << " (kept as " << old
                                              << "): " << std::strerror(errno),
                "remove it by hand; the new " << dir << " is complete");
  }
}

namespace {
// "<dir>.tmp.<pid>" and "<dir>.old.<pid>" of processes that no longer run on this host: what a
// save killed midway left. Ours and those of live processes are kept.
void remove_stale_siblings(const std::string& dir) {
  const std::string parent = parent_of(dir);
  const auto slash = dir.find_last_of('/');
  const std::string base = slash == std::string::npos ? dir : dir.substr(slash + 1);
  DIR* d = ::opendir(parent.c_str());
  if (d == nullptr) return;
  std::vector<std::string> stale;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    for (const char* kind : {".tmp.", ".old."}) {
      const std::string prefix = base + kind;
      if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
      const std::string pid_text = name.substr(prefix.size());
      if (pid_text.find_first_not_of("0123456789") != std::string::npos || pid_text.size() > 9) {
        continue;
      }
      const auto pid = static_cast<pid_t>(std::stol(pid_text));
      if (pid == ::getpid() || pid <= 0) continue;
      if (::kill(pid, 0) != 0 && errno == ESRCH) stale.push_back(parent + "/" + name);
    }
  }
  ::closedir(d);
  for (const auto& path : stale) remove_tree(path);  // best effort: the new dir is complete
}
}  // namespace

void write_dir_atomically(const std::string& dir_in,
                          const std::function<void(const std::string&)>& write) {
  const std::string dir = strip_slashes(dir_in);
  make_dirs(parent_of(dir));
  const std::string tmp = temp_name(dir);
  remove_tree(tmp);
  try {
    make_dirs(tmp);
    write(tmp);
    fsync_dir(tmp);
    replace_dir(tmp, dir);
  } catch (...) {
    remove_tree(tmp);
    throw;
  }
  remove_stale_siblings(dir);
}

}  // namespace gpt2p
