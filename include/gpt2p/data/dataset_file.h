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

#include <cstdint>
#include <map>
#include <string>

#include "gpt2p/data/special_tokens.h"
#include "gpt2p/data/split.h"

namespace gpt2p::data {

inline constexpr const char* kDatasetFormat = "gpt2p-translation-v1";

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
