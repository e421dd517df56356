#include "gpt2p/data/dataset_seal.h"

#include <cstdio>
#include <cstring>
#include <limits>

#include "gpt2p/core/error.h"
#include "gpt2p/core/fnv1a.h"
#include "gpt2p/io/json_input.h"

namespace gpt2p::data {
namespace {

constexpr const char* kBlockMagic = "gpt2p-dataset 1 ";

uint64_t body_hash(const std::string& image) {
  Fnv1a64 sum;
  sum.add(image.data() + kDatasetUserBlock, image.size() - kDatasetUserBlock);
  return sum.value();
}

}  // namespace

void seal_dataset_image(std::string& image) {
  GPT2P_CHECK(
      image.size() > kDatasetUserBlock,
      "a dataset image of " << image.size() << " bytes has nothing after its " << kDatasetUserBlock
                            << "-byte block",
      "pass a whole HDF5 file image written with a " << kDatasetUserBlock << "-byte user block");
  char line[96];
  const int n = std::snprintf(line, sizeof line, "%sfnv1a64 %s bytes %llu\n", kBlockMagic,
                              Fnv1a64::to_hex(body_hash(image)).c_str(),
                              static_cast<unsigned long long>(image.size() - kDatasetUserBlock));
  std::memset(image.data(), 0, kDatasetUserBlock);
  std::memcpy(image.data(), line, static_cast<size_t>(n));
}

std::string read_sealed_dataset(const std::string& path) {
  const std::string remake =
      "the file is damaged, or an older prepare_data wrote it: re-create "
      "it with prepare_data --out " +
      path;
  std::string image = io::read_bounded_file(path, "pass the .h5 file written by prepare_data",
                                            std::numeric_limits<size_t>::max());
  GPT2P_CHECK(image.size() > kDatasetUserBlock &&
                  image.compare(0, std::strlen(kBlockMagic), kBlockMagic) == 0,
              "dataset file " << path << " has no gpt2p checksum block", remake);
  const std::string block = image.substr(0, kDatasetUserBlock);  // NUL-terminated by its zeros
  unsigned long long want_hash = 0, want_bytes = 0;
  GPT2P_CHECK(block.find('\0') != std::string::npos &&
                  std::sscanf(block.c_str() + std::strlen(kBlockMagic), "fnv1a64 %16llx bytes %llu",
                              &want_hash, &want_bytes) == 2,
              "dataset file " << path << ": its checksum block is unreadable", remake);
  const uint64_t bytes = image.size() - kDatasetUserBlock;
  const uint64_t hash = body_hash(image);
  GPT2P_CHECK(bytes == want_bytes && hash == want_hash,
              "dataset file " << path << " does not match its checksum (" << image.size()
                              << " bytes, fnv1a64 " << Fnv1a64::to_hex(hash) << "; written as "
                              << want_bytes + kDatasetUserBlock << " bytes, "
                              << Fnv1a64::to_hex(want_hash) << ")",
              remake);
  return image;
}

}  // namespace gpt2p::data
