// The .safetensors format (Hugging Face): 8-byte little-endian header length N, N bytes of JSON
// {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}},
// then the raw little-endian tensor bytes. Dtypes: F32, F16, BF16, F64, I64.
// The header is checked by io/safetensors_header.h (torch-free) before any tensor is allocated.
#pragma once

#include <torch/types.h>

#include <cstddef>
#include <functional>
#include <map>
#include <string>

namespace gpt2p::model {

struct SafeTensors {
  std::map<std::string, torch::Tensor> tensors;  // CPU, contiguous
  std::map<std::string, std::string> metadata;   // the "__metadata__" object (string values)
};

// Reads the whole file. Errors name the file and the offending tensor or header field.
SafeTensors read_safetensors(const std::string& path);

// The same from the file's bytes in memory; `path` names them in errors.
SafeTensors parse_safetensors(const char* data, size_t size, const std::string& path);

// Writes atomically, every write checked (a full disk or a read-only directory is a FileError
// naming the file). Tensors may be on any device; they are copied to the CPU one at a time.
void write_safetensors(const std::string& path, const std::map<std::string, torch::Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// The file's bytes, in order, handed to `sink` in pieces (e.g. to a FileWriter that also
// checksums them). Unsupported dtypes are reported before the first byte.
using ByteSink = std::function<void(const void* data, size_t n)>;
void stream_safetensors(const ByteSink& sink, const std::map<std::string, torch::Tensor>& tensors,
                        const std::map<std::string, std::string>& metadata = {});

}  // namespace gpt2p::model
