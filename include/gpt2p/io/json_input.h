// JSON that other people and programs made: checkpoints' meta.json and manifest.json, Hugging Face
// config.json, safetensors headers, GPT-2's encoder.json, JSON lines. nlohmann::json parses
// without recursion, but copying, comparing or printing a value recurses once per level, so a
// 200 kB header nested 100,000 deep would end the process with SIGSEGV long after it was read.
// Every such input goes through these functions: at most kJsonMaxDepth levels and a size bound,
// a regular file only (not /dev/zero behind a symbolic link), and one error line that names the
// source.
//
//   const nlohmann::json meta = io::read_json_file(dir + "/meta.json", kCorruptFix);
//   const nlohmann::json row = io::parse_json(line, path + ":" + std::to_string(n), "fix the
//   line");
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace gpt2p::io {

// Deeper than any JSON the project reads or writes (at most 5 levels), far below what a recursive
// copy needs to exhaust a thread's stack.
inline constexpr int kJsonMaxDepth = 64;
// Larger than any JSON input the project reads (GPT-2's encoder.json: 1 MB; safetensors caps its
// header at 100 MB).
inline constexpr size_t kJsonMaxBytes = size_t{100} << 20;

// Parses `text` as one JSON value. Throws gpt2p::Error "<source>: <what is wrong> -- fix: <hint>"
// when it is not valid JSON, is longer than max_bytes, or nests deeper than kJsonMaxDepth.
nlohmann::json parse_json(std::string_view text, const std::string& source, const std::string& hint,
                          size_t max_bytes = kJsonMaxBytes);

// The whole of the regular file `path`, parsed as by parse_json. A missing, unreadable or special
// file (a device, a FIFO, a directory) or one over max_bytes is refused by the same kind of line.
nlohmann::json read_json_file(const std::string& path, const std::string& hint,
                              size_t max_bytes = kJsonMaxBytes);

// The whole of the regular file `path` as bytes, refused as read_json_file refuses it.
std::string read_bounded_file(const std::string& path, const std::string& hint, size_t max_bytes);

// The name of a JSON value's type as a message shows it: "an object", "a string", ...
const char* json_type_name(const nlohmann::json& value);

// What a field read by json_field must be.
enum class JsonType { kObject, kArray, kString, kInteger, kNumber };

// The member `key` of `object`, which must be a JSON object holding `key` as a value of `type`;
// otherwise throws gpt2p::Error "<source>: \"key\" is a string, not an integer -- fix: <hint>"
// (or "... has no \"key\"").
//
//   const auto& r = io::json_field(meta, "layer_range", io::JsonType::kArray, path, kCorruptFix);
const nlohmann::json& json_field(const nlohmann::json& object, const std::string& key,
                                 JsonType type, const std::string& source, const std::string& hint);

// The integer member `key` of `object`, refused as json_field refuses a field, and also when it
// lies outside [lo, hi].
int64_t json_int_field(const nlohmann::json& object, const std::string& key, int64_t lo, int64_t hi,
                       const std::string& source, const std::string& hint);

}  // namespace gpt2p::io
