// Writing files so that nothing is ever half-written: write to "<path>.tmp.<pid>", then rename.
#pragma once

#include <functional>
#include <string>

namespace gpt2p {

// Calls `write(tmp_path)`, then renames tmp_path over `path`. On any exception the temporary is
// removed and the exception propagates; `path` is either the old file or the complete new one.
void write_atomically(const std::string& path, const std::function<void(const std::string&)>& write);

// Same, for a whole directory (checkpoints): `write(tmp_dir)` fills a fresh temporary directory,
// which then replaces `dir` (the previous one is removed only after the new one is in place).
void write_dir_atomically(const std::string& dir, const std::function<void(const std::string&)>& write);

// Removes `path` and, for a directory, everything below it (symbolic links are removed, not
// followed). True when nothing is left at `path` (also when there was nothing); errno tells why
// not. Use this, not std::filesystem::remove_all: PyTorch's wheels (2.5 and later) export their own
// statically linked copy of libstdc++'s std::filesystem, which then shadows the system one in any
// program linking libtorch, and its directory iteration crashed there with GCC 13 headers
// (pytorch/pytorch#133437; seen as a segfault after a checkpoint replaced the previous one).
bool remove_tree(const std::string& path);

// Convenience: the whole text content, atomically.
void write_text_atomically(const std::string& path, const std::string& content);

}  // namespace gpt2p
