// The .safetensors format (Hugging Face): 8-byte little-endian header length N, N bytes of JSON
// {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}},
// then the raw little-endian tensor bytes. Dtypes: F32, F16, BF16, F64, I64.
#pragma once

#include <torch/types.h>

#include <map>
#include <string>

namespace gpt2p::model {

struct SafeTensors {
  std::map<std::string, torch::Tensor> tensors;  // CPU, contiguous
  std::map<std::string, std::string> metadata;   // the "__metadata__" object (string values)
};

// Reads the whole file. Errors name the file and the offending tensor or header field.
SafeTensors read_safetensors(const std::string& path);

// Writes atomically (tensors may be on any device; they are copied to the CPU).
void write_safetensors(const std::string& path, const std::map<std::string, torch::Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace gpt2p::model
