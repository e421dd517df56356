// The translation dataset's splits in memory: each example's token ids (German source, then
// English target) and raw texts. data/dataset_file.h stores them; data/batch.h cuts batches.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace gpt2p::data {

// A read-only view of consecutive token ids (C++17 has no std::span).
struct TokenSpan {
  const int32_t* ptr = nullptr;
  size_t count = 0;
  const int32_t* begin() const { return ptr; }
  const int32_t* end() const { return ptr + count; }
  size_t size() const { return count; }
  int32_t operator[](size_t i) const { return ptr[i]; }
  std::vector<int32_t> to_vector() const { return {begin(), end()}; }
};

// One split in memory; also what prepare_data fills before writing.
class Split {
 public:
  void add(const std::vector<int32_t>& src, const std::vector<int32_t>& tgt,
           const std::string& text_de, const std::string& text_en);

  int64_t size() const { return static_cast<int64_t>(src_lengths_.size()); }
  TokenSpan src(int64_t i) const;
  TokenSpan tgt(int64_t i) const;
  const std::string& text_de(int64_t i) const;
  const std::string& text_en(int64_t i) const;

  int64_t src_tokens() const;  // sum over examples
  int64_t tgt_tokens() const;

  // Raw arrays, as stored.
  const std::vector<int32_t>& tokens() const { return tokens_; }
  const std::vector<int64_t>& offsets() const { return offsets_; }
  const std::vector<int32_t>& src_lengths() const { return src_lengths_; }
  const std::vector<std::string>& texts_de() const { return text_de_; }
  const std::vector<std::string>& texts_en() const { return text_en_; }

  // Builds a split from stored arrays, checking they are consistent (`where` names them in errors).
  static Split from_arrays(std::vector<int32_t> tokens, std::vector<int64_t> offsets,
                           std::vector<int32_t> src_lengths, std::vector<std::string> text_de,
                           std::vector<std::string> text_en, const std::string& where);

 private:
  void check_index(int64_t i) const;

  std::vector<int32_t> tokens_;
  std::vector<int64_t> offsets_{0};
  std::vector<int32_t> src_lengths_;
  std::vector<std::string> text_de_, text_en_;
};

}  // namespace gpt2p::data
