#include "gpt2p/io/safetensors_header.h"

#include <array>
#include <limits>
#include <nlohmann/json.hpp>
#include <string_view>
#include <utility>

#include "gpt2p/core/error.h"
#include "gpt2p/io/json_input.h"

namespace gpt2p::io {

namespace {

const char* const kCorrupt = "the file is corrupt; write it again";
const char* const kTruncated = "the file is truncated or corrupt; write it again";

constexpr std::array<std::pair<const char*, size_t>, 5> kDtypes = {
    {{"F32", 4}, {"F16", 2}, {"BF16", 2}, {"F64", 8}, {"I64", 8}}};

uint64_t read_le64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// An entry's "shape": a JSON array of at most 8 non-negative integers whose product, times the
// element size, fits in 64 bits; returns the byte count.
uint64_t checked_nbytes(const nlohmann::json& shape, size_t element_size, const std::string& path,
                        const std::string& name, std::vector<int64_t>& sizes) {
  GPT2P_CHECK(shape.is_array() && shape.size() <= 8,
              path << ": tensor '" << name << "': shape is " << json_type_name(shape)
                   << (shape.is_array() ? " of more than 8 dimensions" : "")
                   << ", not an array of up to 8 sizes",
              kCorrupt);
  uint64_t n = element_size;
  sizes.clear();
  for (const auto& d : shape) {
    GPT2P_CHECK(d.is_number_unsigned() || (d.is_number_integer() && d.get<int64_t>() >= 0),
                path << ": tensor '" << name << "': shape " << shape.dump()
                     << " holds something other than a size >= 0",
                kCorrupt);
    const auto size = d.get<uint64_t>();
    GPT2P_CHECK(size <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) &&
                    (size == 0 || n <= std::numeric_limits<uint64_t>::max() / size),
                path << ": tensor '" << name << "': shape " << shape.dump()
                     << " has more bytes than 64 bits can count",
                kCorrupt);
    n *= size;
    sizes.push_back(static_cast<int64_t>(size));
  }
  return n;
}

const nlohmann::json& field(const nlohmann::json& entry, const char* key, const std::string& path,
                            const std::string& name) {
  GPT2P_CHECK(entry.contains(key), path << ": tensor '" << name << "' has no \"" << key << "\"",
              kCorrupt);
  return entry.at(key);
}

}  // namespace

size_t safetensors_element_size(const std::string& dtype, const std::string& path,
                                const std::string& tensor) {
  for (const auto& [name, size] : kDtypes) {
    if (dtype == name) return size;
  }
  GPT2P_FAIL(path << ": tensor '" << tensor << "' has unsupported dtype '" << dtype << "'",
             "supported dtypes are F32, F16, BF16, F64, I64; convert the file with safetensors "
             "in Python");
}

SafetensorsHeader parse_safetensors_header(const char* bytes, size_t size,
                                           const std::string& path) {
  GPT2P_CHECK(size >= 8, path << " is " << size << " bytes: too short for safetensors",
              "the file is truncated or not safetensors; write it again");
  const uint64_t n = read_le64(reinterpret_cast<const unsigned char*>(bytes));
  GPT2P_CHECK(n <= size - 8, path << ": header length " << n << " exceeds the file size " << size,
              "the file is truncated or not safetensors; write it again");
  const nlohmann::json header = parse_json(std::string_view(bytes + 8, static_cast<size_t>(n)),
                                           path + " (safetensors header)", kCorrupt);
  GPT2P_CHECK(header.is_object(),
              path << ": safetensors header is " << json_type_name(header) << ", not a JSON object",
              kCorrupt);
  SafetensorsHeader out;
  out.data_offset = 8 + n;
  out.data_size = size - 8 - n;
  out.entries.reserve(header.size());
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      GPT2P_CHECK(entry.is_object(),
                  path << ": __metadata__ is " << json_type_name(entry) << ", not an object",
                  kCorrupt);
      for (const auto& [k, v] : entry.items()) {
        GPT2P_CHECK(v.is_string(),
                    path << ": __metadata__[\"" << k << "\"] is " << json_type_name(v)
                         << "; safetensors metadata values are strings",
                    kCorrupt);
        out.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    GPT2P_CHECK(entry.is_object(),
                path << ": header entry for tensor '" << name << "' is " << json_type_name(entry)
                     << ", not an object",
                kCorrupt);
    SafetensorsEntry e;
    e.name = name;
    const auto& dtype = field(entry, "dtype", path, name);
    GPT2P_CHECK(
        dtype.is_string(),
        path << ": tensor '" << name << "': dtype is " << json_type_name(dtype) << ", not a string",
        kCorrupt);
    e.dtype = dtype.get<std::string>();
    const size_t element_size = safetensors_element_size(e.dtype, path, name);
    const auto& shape = field(entry, "shape", path, name);
    const uint64_t nbytes = checked_nbytes(shape, element_size, path, name, e.shape);
    const auto& offsets = field(entry, "data_offsets", path, name);
    GPT2P_CHECK(offsets.is_array() && offsets.size() == 2 && offsets[0].is_number_unsigned() &&
                    offsets[1].is_number_unsigned(),
                path << ": tensor '" << name << "': data_offsets " << offsets.dump()
                     << " is not a pair of byte offsets",
                kCorrupt);
    e.begin = offsets[0].get<uint64_t>();
    e.end = offsets[1].get<uint64_t>();
    // A tensor is never larger than the file holds: callers may allocate end - begin bytes.
    GPT2P_CHECK(e.begin <= e.end && e.end <= out.data_size && e.end - e.begin == nbytes,
                path << ": tensor '" << name << "' (" << e.dtype << " " << shape.dump() << ", "
                     << nbytes << " bytes) has data_offsets [" << e.begin << ", " << e.end
                     << ") in a data section of " << out.data_size << " bytes",
                kTruncated);
    out.entries.push_back(std::move(e));
  }
  return out;
}

}  // namespace gpt2p::io
