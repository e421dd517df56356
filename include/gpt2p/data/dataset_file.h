// The prepared, tokenized translation dataset (one HDF5 file, written by prepare_data).
//
// Layout (format "gpt2p-translation-v1"):
//   /                      attributes: format, tokenizer_identity, vocab_size (incl. specials),
//                          eos_de_id, eos_en_id, pad_id, source, created (UTC ISO-8601),
//                          n_train, n_validation, n_test
//   /<split>/tokens        int32 [total]   src ids then tgt ids of every example, no special tokens
//   /<split>/offsets       int64 [n + 1]   example i is tokens[offsets[i], offsets[i+1])
//   /<split>/src_lengths   int32 [n]       the first src_lengths[i] of those are German
//   /<split>/text_de       vlen str [n]    the raw texts (references for BLEU)
//   /<split>/text_en       vlen str [n]
// for <split> in train, validation, test. Splits are small: they are read whole into memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "gpt2p/data/special_tokens.h"

namespace gpt2p::data {

inline constexpr const char* kDatasetFormat = "gpt2p-translation-v1";

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

struct DatasetMeta {
  std::string tokenizer_identity;
  int32_t vocab_size = 0;  // including the special tokens
  SpecialTokens special;
  std::string source;   // human-readable: what the pairs came from
  std::string created;  // UTC ISO-8601; write_dataset_file fills it when empty
};

// Writes the file atomically (temp file, then rename). `splits` must hold train, validation, test.
void write_dataset_file(const std::string& path, const DatasetMeta& meta,
                        const std::map<std::string, Split>& splits);

class DatasetFile {
 public:
  // Reads the whole file. Clear errors when it is missing, fails its checksum block
  // (data/dataset_seal.h), is not HDF5, or not a gpt2p dataset. The HDF5 library first reads it in
  // an isolated child process, so that a file that crashes or hangs libhdf5 is refused too.
  static DatasetFile open(const std::string& path);

  // The dataset in the HDF5 file image `image` (with its 512-byte block, which is not checked),
  // read in this process; `path` names it in errors. What open() runs, without its checks.
  static DatasetFile from_image(const std::string& image, const std::string& path);

  // Throws "dataset X was made with tokenizer A (vocab N) but this run uses B (vocab M): ..."
  void require_tokenizer(const std::string& identity, int32_t vocab_size) const;

  const Split& split(const std::string& name) const;  // train | validation | test
  const DatasetMeta& meta() const { return meta_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  DatasetMeta meta_;
  std::map<std::string, Split> splits_;
};

}  // namespace gpt2p::data
