// A real small file system for tests of full and read-only disks.
#pragma once

#include <sys/mount.h>
#include <sys/statvfs.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include "support/temp_dir.h"

namespace gpt2p::testing {

// A small tmpfs mounted on a fresh directory, to make a real full or read-only file system.
// Mounting needs root (the test machines run tests as root); tests skip when it is refused.
class Tmpfs {
 public:
  explicit Tmpfs(const std::string& options, unsigned long flags = 0) : dir_("tmpfs") {
    mounted_ = ::mount("tmpfs", dir_.str().c_str(), "tmpfs", flags, options.c_str()) == 0;
    error_ = mounted_ ? "" : std::strerror(errno);
  }
  ~Tmpfs() {
    if (mounted_) ::umount2(dir_.str().c_str(), MNT_DETACH);
  }
  Tmpfs(const Tmpfs&) = delete;
  Tmpfs& operator=(const Tmpfs&) = delete;

  bool mounted() const { return mounted_; }
  const std::string& error() const { return error_; }
  std::string operator/(const std::string& name) const { return dir_ / name; }
  int entries() const { return dir_.entries(); }
  bool remount_read_only() const {
    return ::mount("tmpfs", dir_.str().c_str(), "tmpfs", MS_REMOUNT | MS_RDONLY, "") == 0;
  }
  uint64_t free_bytes() const {
    struct statvfs st {};
    ::statvfs(dir_.str().c_str(), &st);
    return static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
  }

 private:
  TempDir dir_;
  bool mounted_ = false;
  std::string error_;
};

}  // namespace gpt2p::testing
