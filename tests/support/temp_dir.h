// A fresh directory under the system temp dir for one test, removed (with remove_tree, never
// std::filesystem::remove_all: see core/atomic_file.h) when it goes out of scope.
#pragma once

#include <dirent.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>

#include "gpt2p/core/atomic_file.h"

namespace gpt2p::testing {

class TempDir {
 public:
  // "<tmp>/gpt2p_<tag>_<pid>_<n>": unique per process and object, so ctest may run test
  // processes in parallel.
  explicit TempDir(const std::string& tag = "test") {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("gpt2p_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    remove_tree(path_.string());
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { remove_tree(path_.string()); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::string str() const { return path_.string(); }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

  // Entries directly in the directory (readdir, not std::filesystem's iterators: see above).
  int entries() const {
    int n = 0;
    if (DIR* d = ::opendir(path_.c_str())) {
      while (const dirent* e = ::readdir(d)) {
        const std::string name = e->d_name;
        n += name != "." && name != ".." ? 1 : 0;
      }
      ::closedir(d);
    }
    return n;
  }

 private:
  std::filesystem::path path_;
};

}  // namespace gpt2p::testing
