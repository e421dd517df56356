#include "gpt2p/core/atomic_file.h"

#include <ftw.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <filesystem>
#include <fstream>

#include "gpt2p/core/error.h"

namespace gpt2p {
namespace fs = std::filesystem;

namespace {
std::string temp_name(const std::string& path) {
  return path + ".tmp." + std::to_string(::getpid());
}

int remove_entry(const char* path, const struct stat* /*st*/, int /*flag*/, struct FTW* /*ftw*/) {
  return std::remove(path) == 0 || errno == ENOENT ? 0 : -1;
}
}  // namespace

bool remove_tree(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return errno == ENOENT;
  // Depth first (children before their directory), never following symbolic links.
  return ::nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS) == 0;
}

void write_atomically(const std::string& path, const std::function<void(const std::string&)>& write) {
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) fs::create_directories(parent);
  const std::string tmp = temp_name(path);
  try {
    write(tmp);
    std::error_code ec;
    fs::rename(tmp, path, ec);
    GPT2P_CHECK(!ec, "cannot rename " << tmp << " to " << path << ": " << ec.message(),
                "check that the directory is writable and on one file system");
  } catch (...) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    throw;
  }
}

void write_dir_atomically(const std::string& dir, const std::function<void(const std::string&)>& write) {
  const fs::path parent = fs::path(dir).parent_path();
  if (!parent.empty()) fs::create_directories(parent);
  const std::string tmp = temp_name(dir);
  const std::string old = dir + ".old." + std::to_string(::getpid());
  remove_tree(tmp);
  try {
    fs::create_directories(tmp);
    write(tmp);
    if (fs::exists(dir)) fs::rename(dir, old);
    fs::rename(tmp, dir);
    GPT2P_CHECK(remove_tree(old), "cannot remove the previous " << dir << " (kept as " << old
                                      << "): " << std::strerror(errno),
                "remove it by hand; the new " << dir << " is complete");
  } catch (...) {
    remove_tree(tmp);
    std::error_code ec;
    if (!fs::exists(dir) && fs::exists(old)) fs::rename(old, dir, ec);
    throw;
  }
}

void write_text_atomically(const std::string& path, const std::string& content) {
  write_atomically(path, [&](const std::string& tmp) {
    std::ofstream out(tmp, std::ios::binary);
    GPT2P_CHECK(out.good(), "cannot open " << tmp << " for writing", "check the directory exists and is writable");
    out << content;
    out.close();
    GPT2P_CHECK(!out.fail(), "writing " << tmp << " failed", "check free disk space");
  });
}

}  // namespace gpt2p
