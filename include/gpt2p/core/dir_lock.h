// One job at a time in an output directory. Two trainers writing one --out damage each other:
// the second truncates the first's rank files, or replaces the checkpoint it resumes. A trainer's
// rank 0 therefore holds an flock(2) on "<dir>/run.lock" for as long as it runs; the file says who
// holds it (program, pid, host, start time), so that a second job can be refused with a line that
// names the first. The kernel drops the lock when the process ends, however it ends (SIGKILL too),
// so a lock is never stale; a lock released normally also removes the file. NFS and Lustre
// (mounted with -o flock) pass flock on to every client; where a file system refuses locks, the
// run goes on without one and says so.
#pragma once

#include <memory>
#include <string>
#include <utility>

namespace gpt2p {

class DirLock {
 public:
  enum class Outcome { kHeld, kBusy, kUnsupported };

  // Tries to lock `dir` (which must exist) for `owner` (e.g. "dp_train"). kHeld: the returned
  // lock holds it until destroyed. kBusy: another process holds it; `detail` says who, from the
  // lock file. kUnsupported: the file system refuses locks; `detail` says why. Throws a FileError
  // when the lock file cannot be created or written.
  static std::unique_ptr<DirLock> acquire(const std::string& dir, const std::string& owner,
                                          Outcome& outcome, std::string& detail);

  ~DirLock();
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

  static constexpr const char* kFileName = "run.lock";

 private:
  DirLock(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_;
  std::string path_;
};

}  // namespace gpt2p
