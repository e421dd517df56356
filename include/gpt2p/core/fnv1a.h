// 64-bit FNV-1a: a hash that is the same on every machine, compiler and run. Not cryptographic:
// it names content (a tokenizer's identity, a training split's fingerprint) and catches damage
// (a dataset file's checksum), not deliberate forgery.
//
//   Fnv1a64 h;
//   h.add(tokens.data(), tokens.size() * sizeof(int32_t));
//   const std::string id = h.hex();  // 16 lowercase hex digits
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace gpt2p {

class Fnv1a64 {
 public:
  static constexpr uint64_t kOffsetBasis = 14695981039346656037ULL;
  static constexpr uint64_t kPrime = 1099511628211ULL;

  void add(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) hash_ = (hash_ ^ p[i]) * kPrime;
  }
  void add(std::string_view bytes) { add(bytes.data(), bytes.size()); }

  uint64_t value() const { return hash_; }
  std::string hex() const { return to_hex(hash_); }

  // 16 lowercase hex digits of `v`.
  static std::string to_hex(uint64_t v) {
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
    return buf;
  }

 private:
  uint64_t hash_ = kOffsetBasis;
};

}  // namespace gpt2p
