#include "gpt2p/core/dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <ctime>

#include "gpt2p/core/atomic_file.h"
#include "gpt2p/core/process_info.h"

namespace gpt2p {
namespace {

// The holder's line from the lock file (at most one line of 512 bytes), or a placeholder.
std::string read_holder(int fd) {
  std::array<char, 512> buf{};
  const ssize_t n = ::pread(fd, buf.data(), buf.size() - 1, 0);
  std::string text = n > 0 ? std::string(buf.data(), static_cast<size_t>(n)) : "";
  text = text.substr(0, text.find('\n'));
  return text.empty() ? "a process that has not written its name yet" : text;
}

}  // namespace

std::unique_ptr<DirLock> DirLock::acquire(const std::string& dir, const std::string& owner,
                                          Outcome& outcome, std::string& detail) {
  const std::string path = dir + "/" + kFileName;
  for (;;) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) throw_file_error(errno, "creating the lock file", path);
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      if (err == EWOULDBLOCK) {
        outcome = Outcome::kBusy;
        detail = read_holder(fd);
      } else {
        outcome = Outcome::kUnsupported;
        detail = path + ": " + std::strerror(err);
      }
      ::close(fd);
      return nullptr;
    }
    // The holder before us may have removed the file between our open and our flock: then this
    // lock is on a file no longer in the directory, and another job may lock a new one. Only a
    // lock on the file the path names now counts.
    struct stat held {
    }, named{};
    if (::fstat(fd, &held) == 0 && ::stat(path.c_str(), &named) == 0 &&
        held.st_dev == named.st_dev && held.st_ino == named.st_ino) {
      const std::string line = owner + " (pid " + std::to_string(::getpid()) + " on " +
                               host_name() + ", since " + utc_timestamp() + ")\n";
      if (::ftruncate(fd, 0) != 0 ||
          ::pwrite(fd, line.data(), line.size(), 0) != static_cast<ssize_t>(line.size())) {
        const int err = errno;
        ::close(fd);
        throw_file_error(err, "writing the lock file", path);
      }
      outcome = Outcome::kHeld;
      return std::unique_ptr<DirLock>(new DirLock(fd, path));
    }
    ::close(fd);
  }
}

// Removed while still locked, so that a job waiting to open it finds either this locked file or
// none (and then creates its own); see the inode check in acquire().
DirLock::~DirLock() {
  ::unlink(path_.c_str());
  ::close(fd_);
}

}  // namespace gpt2p
