// The torch-free half of reading a .safetensors file (Hugging Face): the 8-byte little-endian
// header length N, the N bytes of JSON
//   {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}}
// and the checks that every tensor lies inside the data section that follows. model/safetensors.h
// turns the entries into tensors; tools and tests that need no torch use this alone.
//
//   const io::SafetensorsHeader h = io::parse_safetensors_header(bytes.data(), bytes.size(), path);
//   for (const auto& e : h.entries) copy(bytes.data() + h.data_offset + e.begin, e.end - e.begin);
//
// Nothing is allocated in proportion to a size the file claims: every entry is checked against
// the bytes actually there first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace gpt2p::io {

struct SafetensorsEntry {
  std::string name;
  std::string dtype;           // one of F32, F16, BF16, F64, I64
  std::vector<int64_t> shape;  // at most 8 sizes, each >= 0
  uint64_t begin = 0;          // byte offsets within the data section: [begin, end)
  uint64_t end = 0;            // end - begin == product(shape) * element size
};

struct SafetensorsHeader {
  std::map<std::string, std::string> metadata;  // the "__metadata__" object (string values)
  std::vector<SafetensorsEntry> entries;        // in the order of their names
  uint64_t data_offset = 0;                     // where the data section starts: 8 + N
  uint64_t data_size = 0;                       // its length: the rest of the file
};

// Bytes per element of a safetensors dtype name; throws gpt2p::Error naming `path`, the tensor
// and the dtype when it is not one of F32, F16, BF16, F64, I64.
size_t safetensors_element_size(const std::string& dtype, const std::string& path,
                                const std::string& tensor);

// Validates the header of a whole safetensors file held in bytes[0, size). `path` names it in
// errors. Throws gpt2p::Error (naming the file and the tensor or field) when the file is too short,
// the header length exceeds the file, the header is not a JSON object (at most io::kJsonMaxDepth
// deep), an entry lacks or mistypes dtype, shape or data_offsets, a shape's byte count does not
// fit 64 bits, or a tensor's data_offsets are not [begin, begin + its byte count) inside the data
// section.
SafetensorsHeader parse_safetensors_header(const char* bytes, size_t size, const std::string& path);

}  // namespace gpt2p::io
