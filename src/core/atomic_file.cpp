#include "gpt2p/core/atomic_file.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "gpt2p/core/error.h"

namespace gpt2p {
namespace fs = std::filesystem;

namespace {
std::string temp_name(const std::string& path) {
  return path + ".tmp." + std::to_string(::getpid());
}
}  // namespace

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
  std::error_code ec;
  fs::remove_all(tmp, ec);
  try {
    fs::create_directories(tmp);
    write(tmp);
    if (fs::exists(dir)) fs::rename(dir, old);
    fs::rename(tmp, dir);
    fs::remove_all(old, ec);
  } catch (...) {
    fs::remove_all(tmp, ec);
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
