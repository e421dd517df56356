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

// Convenience: the whole text content, atomically.
void write_text_atomically(const std::string& path, const std::string& content);

}  // namespace gpt2p
