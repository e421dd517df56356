// The checksum block at the start of every dataset file prepare_data writes.
//
// The file's first 512 bytes are an HDF5 user block, which HDF5 leaves to the application. Ours
// holds one line of text and the 64-bit FNV-1a hash of everything after the block:
//   "gpt2p-dataset 1 fnv1a64 <16 hex digits> bytes <decimal>\n", then zeros.
// A reader checks it before HDF5 sees a byte, so a damaged file is refused with one line instead
// of reaching libhdf5, which crashes on some damaged files. (A file crafted with a valid block
// still reaches it: DatasetFile::open reads it in an isolated child first, core/isolated.h.)
//
//   std::string image = ...;            // an HDF5 file image with a 512-byte user block
//   data::seal_dataset_image(image);    // before writing it
//   const std::string bytes = data::read_sealed_dataset(path);  // checked, whole
#pragma once

#include <cstddef>
#include <string>

namespace gpt2p::data {

inline constexpr size_t kDatasetUserBlock = 512;

// Writes the block for image[kDatasetUserBlock, end) into image[0, kDatasetUserBlock).
void seal_dataset_image(std::string& image);

// The whole of the regular file `path`, once its block matches the rest. Throws gpt2p::Error
// naming the file when it has no block (an older prepare_data wrote it) or does not match it.
std::string read_sealed_dataset(const std::string& path);

}  // namespace gpt2p::data
