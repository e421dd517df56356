#include "gpt2p/model/safetensors.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "gpt2p/core/atomic_file.h"
#include "gpt2p/core/error.h"

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

uint64_t read_le64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
}  // namespace

SafeTensors read_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  GPT2P_CHECK(in.good(), "cannot open safetensors file " << path,
              "check the path (a Hugging Face directory holds model.safetensors)");
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
  GPT2P_CHECK(!in.bad(), "reading " << path << " failed: " << std::strerror(errno),
              "check the disk and that the file is readable");
  return parse_safetensors(bytes.data(), bytes.size(), path);
}

SafeTensors parse_safetensors(const char* bytes, size_t size, const std::string& path) {
  GPT2P_CHECK(size >= 8, path << " is " << size << " bytes: too short for safetensors",
              "the file is truncated or not safetensors; write it again");
  const uint64_t n = read_le64(reinterpret_cast<const unsigned char*>(bytes));
  GPT2P_CHECK(n <= size - 8, path << ": header length " << n << " exceeds the file size " << size,
              "the file is truncated or not safetensors; write it again");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes + 8, bytes + 8 + n);
  } catch (const nlohmann::json::exception& e) {
    GPT2P_FAIL(path << ": safetensors header is not valid JSON: " << e.what(),
               "the file is corrupt; write it again");
  }
  GPT2P_CHECK(header.is_object(), path << ": safetensors header is not a JSON object",
              "the file is corrupt; write it again");
  const char* data = bytes + 8 + n;
  const uint64_t data_size = size - 8 - n;
  SafeTensors out;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      for (const auto& [k, v] : entry.items()) {
        out.metadata[k] = v.is_string() ? v.get<std::string>() : v.dump();
      }
      continue;
    }
    GPT2P_CHECK(entry.is_object() && entry.contains("dtype") && entry.contains("shape") &&
                    entry.contains("data_offsets") && entry["data_offsets"].size() == 2,
                path << ": header entry for tensor '" << name
                     << "' lacks dtype/shape/data_offsets: " << entry.dump(),
                "the file is corrupt; write it again");
    const auto type = parse_dtype(entry["dtype"].get<std::string>(), path, name);
    const auto shape = entry["shape"].get<std::vector<int64_t>>();
    const auto begin = entry["data_offsets"][0].get<uint64_t>();
    const auto end = entry["data_offsets"][1].get<uint64_t>();
    auto tensor = torch::empty(shape, torch::TensorOptions().dtype(type));
    const uint64_t nbytes = static_cast<uint64_t>(tensor.numel()) * tensor.element_size();
    GPT2P_CHECK(begin <= end && end <= data_size && end - begin == nbytes,
                path << ": tensor '" << name << "' (" << entry["dtype"].get<std::string>() << " "
                     << entry["shape"].dump() << ", " << nbytes << " bytes) has data_offsets ["
                     << begin << ", " << end << ") in a data section of " << data_size << " bytes",
                "the file is truncated or corrupt; write it again");
    if (nbytes > 0) std::memcpy(tensor.data_ptr(), data + begin, nbytes);
    out.tensors.emplace(name, std::move(tensor));
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
