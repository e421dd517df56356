// What checkpoint.cpp and checkpoint_meta.cpp share: the file names, the checksum of a file as
// meta.json records it, and the reading of meta.json itself. Private to src/model.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "gpt2p/model/checkpoint.h"

namespace gpt2p::model::checkpoint_files {

inline constexpr const char* kFormat = "gpt2p-checkpoint";
inline constexpr const char* kSetFormat = "gpt2p-checkpoint-set";
inline constexpr const char* kModelFile = "model.safetensors";
inline constexpr const char* kOptimizerFile = "optimizer.pt";
inline constexpr const char* kMetaFile = "meta.json";
inline constexpr const char* kManifestFile = "manifest.json";
inline constexpr const char* kCorruptFix = "the checkpoint is corrupt: resume from an earlier copy";

// Bytes as lowercase hex, and back (`where` and `field` name them in errors).
std::string to_hex(const std::string& bytes);
std::string from_hex(const std::string& hex, const std::string& where, const std::string& field);

// CRC-32 (zlib's) of what passes through, with the byte count.
struct Checksum {
  uint32_t crc;
  uint64_t bytes = 0;

  Checksum();
  void add(const void* data, size_t n);
  std::string hex() const;
  nlohmann::json to_json() const { return {{"bytes", bytes}, {"crc32", hex()}}; }
};

// The whole of a checkpoint's file: a regular file only (a symbolic link to /dev/zero would
// otherwise be read until memory ran out).
std::string read_file_bytes(const std::string& path);

// dir/meta.json, which must be a gpt2p checkpoint's.
nlohmann::json read_meta(const std::string& dir);

// Checks `bytes` (the content of dir/name) against meta.json's "files" entry. Without "files" the
// file cannot be checked: refused, or (allow_unverified) loaded with a warning.
void verify_file(const nlohmann::json& meta, const std::string& dir, const std::string& name,
                 const std::string& bytes, const LoadOptions& options);

}  // namespace gpt2p::model::checkpoint_files
