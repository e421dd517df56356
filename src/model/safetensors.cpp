#include "gpt2p/model/safetensors.h"

#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <string_view>
#include <vector>

#include "gpt2p/core/atomic_file.h"
#include "gpt2p/core/error.h"
#include "gpt2p/io/json_input.h"
#include "gpt2p/io/safetensors_header.h"

namespace gpt2p::model {

namespace {
const std::vector<std::pair<std::string, torch::ScalarType>>& dtype_table() {
  static const std::vector<std::pair<std::string, torch::ScalarType>> table = {
      {"F32", torch::kFloat32},
      {"F16", torch::kFloat16},
      {"BF16", torch::kBFloat16},
      {"F64", torch::kFloat64},
      {"I64", torch::kInt64}};
  return table;
}

// The torch type of a dtype name that io::parse_safetensors_header accepted.
torch::ScalarType parse_dtype(const std::string& name, const std::string& path,
                              const std::string& tensor) {
  for (const auto& [n, t] : dtype_table()) {
    if (n == name) return t;
  }
  GPT2P_FAIL(path << ": tensor '" << tensor << "' has unsupported dtype '" << name << "'",
             "supported dtypes are F32, F16, BF16, F64, I64; convert the file with safetensors "
             "in Python");
}

std::string dtype_name(torch::ScalarType type, const std::string& tensor) {
  for (const auto& [n, t] : dtype_table()) {
    if (t == type) return n;
  }
  GPT2P_FAIL("cannot write tensor '" << tensor << "' of dtype " << type << " to safetensors",
             "convert it to float32, float16, bfloat16, float64 or int64 first");
}

}  // namespace

SafeTensors read_safetensors(const std::string& path) {
  // A regular file only: a symbolic link to /dev/zero would otherwise be read until memory ran out.
  const std::string bytes = io::read_bounded_file(
      path, "check the path (a Hugging Face directory holds model.safetensors)",
      std::numeric_limits<size_t>::max());
  return parse_safetensors(bytes.data(), bytes.size(), path);
}

SafeTensors parse_safetensors(const char* bytes, size_t size, const std::string& path) {
  // Every check happens before the first tensor is allocated: the header, each entry's dtype and
  // shape, and that its bytes lie inside the file.
  const io::SafetensorsHeader header = io::parse_safetensors_header(bytes, size, path);
  const char* data = bytes + header.data_offset;
  SafeTensors out;
  out.metadata = header.metadata;
  for (const auto& e : header.entries) {
    const auto type = parse_dtype(e.dtype, path, e.name);
    auto tensor = torch::empty(e.shape, torch::TensorOptions().dtype(type));
    const uint64_t nbytes = e.end - e.begin;
    if (nbytes > 0) std::memcpy(tensor.data_ptr(), data + e.begin, nbytes);
    out.tensors.emplace(e.name, std::move(tensor));
  }
  return out;
}

void stream_safetensors(const ByteSink& sink, const std::map<std::string, torch::Tensor>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    const uint64_t nbytes = static_cast<uint64_t>(t.numel()) * t.element_size();
    header[name] = {{"dtype", dtype_name(t.scalar_type(), name)},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data section starts 8-byte aligned
  unsigned char len[8];
  uint64_t n = text.size();
  for (unsigned char& b : len) {
    b = static_cast<unsigned char>(n & 0xff);
    n >>= 8;
  }
  sink(len, sizeof len);
  sink(text.data(), text.size());
  for (const auto& [name, t] : tensors) {
    const auto cpu = t.detach().to(torch::kCPU).contiguous();
    const size_t nbytes = static_cast<size_t>(cpu.numel()) * cpu.element_size();
    if (nbytes > 0) sink(cpu.data_ptr(), nbytes);
  }
}

void write_safetensors(const std::string& path, const std::map<std::string, torch::Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  for (const auto& [name, t] : tensors) dtype_name(t.scalar_type(), name);  // before any file
  write_file_atomically(path, [&](FileWriter& out) {
    stream_safetensors([&](const void* data, size_t n) { out.write(data, n); }, tensors, metadata);
  });
}

}  // namespace gpt2p::model
