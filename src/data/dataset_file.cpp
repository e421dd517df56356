#include "gpt2p/data/dataset_file.h"

#include <H5Cpp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "gpt2p/core/atomic_file.h"
#include "gpt2p/core/error.h"
#include "gpt2p/core/isolated.h"
#include "gpt2p/core/process_info.h"
#include "gpt2p/data/corpus.h"
#include "gpt2p/data/dataset_seal.h"

namespace gpt2p::data {

// ------------------------------------------------------------------------------------------------
// HDF5 helpers
// ------------------------------------------------------------------------------------------------
namespace {

// What every HDF5 file holds at the start of its superblock.
const std::string kSignature("\x89HDF\r\n\x1a\n", 8);

const H5::StrType& vlen_str() {
  static const H5::StrType t(H5::PredType::C_S1, H5T_VARIABLE);
  return t;
}

template <class T>
void write_array(H5::Group& g, const char* name, const H5::PredType& file_type,
                 const H5::PredType& mem_type, const std::vector<T>& v) {
  const hsize_t dims[1] = {v.size()};
  H5::DataSpace space(1, dims);
  H5::DataSet ds = g.createDataSet(name, file_type, space);
  if (!v.empty()) ds.write(v.data(), mem_type);
}

void write_strings(H5::Group& g, const char* name, const std::vector<std::string>& v) {
  const hsize_t dims[1] = {v.size()};
  H5::DataSpace space(1, dims);
  H5::DataSet ds = g.createDataSet(name, vlen_str(), space);
  std::vector<const char*> ptrs;
  ptrs.reserve(v.size());
  for (const auto& s : v) ptrs.push_back(s.c_str());
  if (!v.empty()) ds.write(ptrs.data(), vlen_str());
}

void set_attr(H5::H5Object& obj, const char* name, const std::string& value) {
  H5::Attribute a = obj.createAttribute(name, vlen_str(), H5::DataSpace(H5S_SCALAR));
  const char* p = value.c_str();
  a.write(vlen_str(), &p);
}

void set_attr(H5::H5Object& obj, const char* name, int64_t value) {
  H5::Attribute a = obj.createAttribute(name, H5::PredType::STD_I64LE, H5::DataSpace(H5S_SCALAR));
  a.write(H5::PredType::NATIVE_INT64, &value);
}

std::string get_str_attr(const H5::H5Object& obj, const char* name, const std::string& where) {
  GPT2P_CHECK(obj.attrExists(name), where << " has no attribute '" << name << "'",
              "the file was not written by prepare_data (or by an older version): rerun "
              "prepare_data");
  H5::Attribute a = obj.openAttribute(name);
  GPT2P_CHECK(a.getTypeClass() == H5T_STRING && a.getSpace().getSimpleExtentNpoints() == 1,
              where << ": attribute '" << name << "' is not one string",
              "the file is damaged: rerun prepare_data");
  const H5::StrType type = a.getStrType();
  std::string value;
  if (!type.isVariableStr()) {
    a.read(type, value);
    return value;
  }
  // Variable length: the C++ wrapper's string read runs strlen on what the file points to, which a
  // damaged file leaves null.
  char* text = nullptr;
  a.read(type, static_cast<void*>(&text));
  GPT2P_CHECK(text != nullptr, where << ": attribute '" << name << "' holds no string",
              "the file is damaged: rerun prepare_data");
  value = text;
  H5free_memory(text);
  return value;
}

int64_t get_int_attr(const H5::H5Object& obj, const char* name, const std::string& where) {
  GPT2P_CHECK(obj.attrExists(name), where << " has no attribute '" << name << "'",
              "the file was not written by prepare_data (or by an older version): rerun "
              "prepare_data");
  H5::Attribute a = obj.openAttribute(name);
  // One integer: reading a longer one into `value` would write past it.
  GPT2P_CHECK(a.getTypeClass() == H5T_INTEGER && a.getSpace().getSimpleExtentNpoints() == 1 &&
                  a.getDataType().getSize() <= sizeof(int64_t),
              where << ": attribute '" << name << "' is not one integer",
              "the file is damaged: rerun prepare_data");
  int64_t value = 0;
  a.read(H5::PredType::NATIVE_INT64, &value);
  return value;
}

// Where the arrays of one split are read from: the group's name for messages, and the size of
// the whole file, which bounds what they can hold.
struct Array {
  std::string where;
  hsize_t file_size = 0;
};

H5::DataSet open_1d(const H5::Group& g, const char* name, const Array& a, hsize_t& n) {
  GPT2P_CHECK(g.nameExists(name), a.where << "/" << name << " is missing",
              "rerun prepare_data to rebuild the dataset file");
  H5::DataSet ds = g.openDataSet(name);
  H5::DataSpace space = ds.getSpace();
  GPT2P_CHECK(space.getSimpleExtentNdims() == 1, a.where << "/" << name << " is not 1-D",
              "rerun prepare_data to rebuild the dataset file");
  space.getSimpleExtentDims(&n);
  // No more elements than the file can hold (a damaged header may claim any number, and the
  // reader allocates them first). prepare_data compresses nothing; 64 per byte of file leaves room
  // for any file that is not damaged.
  GPT2P_CHECK(n <= a.file_size * 64,
              a.where << "/" << name << " claims " << n << " elements, more than the file of "
                      << a.file_size << " bytes can hold",
              "the file is damaged: rerun prepare_data");
  return ds;
}

template <class T>
std::vector<T> read_array(const H5::Group& g, const char* name, const H5::PredType& mem_type,
                          const Array& a) {
  hsize_t n = 0;
  H5::DataSet ds = open_1d(g, name, a, n);
  // Integers of at most T's width: HDF5 would otherwise convert float ids, or clip wide ones,
  // without a word.
  const H5::DataType type = ds.getDataType();
  GPT2P_CHECK(
      type.getClass() == H5T_INTEGER && type.getSize() <= sizeof(T),
      a.where << "/" << name << " holds "
              << (type.getClass() == H5T_INTEGER ? "integers" : "values that are not integers")
              << " of " << type.getSize() << " bytes; a gpt2p dataset stores " << sizeof(T)
              << "-byte integers there",
      "rerun prepare_data to rebuild the dataset file");
  std::vector<T> v(n);
  if (n > 0) ds.read(v.data(), mem_type);
  return v;
}

std::vector<std::string> read_strings(const H5::Group& g, const char* name, const Array& a) {
  hsize_t n = 0;
  H5::DataSet ds = open_1d(g, name, a, n);
  GPT2P_CHECK(ds.getTypeClass() == H5T_STRING, a.where << "/" << name << " does not hold strings",
              "the file is damaged: rerun prepare_data");
  std::vector<std::string> out;
  if (n == 0) return out;
  std::vector<char*> ptrs(n, nullptr);
  ds.read(ptrs.data(), vlen_str());
  out.reserve(n);
  for (char* p : ptrs) out.emplace_back(p != nullptr ? p : "");
  H5::DataSpace space = ds.getSpace();
  H5::DataSet::vlenReclaim(ptrs.data(), vlen_str(), space);
  return out;
}

// Every id of `split` must be a token of the file's vocabulary: a model indexes its embedding with
// them, and an id past it would only fail deep inside torch.
void check_token_ids(const Split& split, int32_t vocab_size, const std::string& where) {
  const auto& tokens = split.tokens();
  const auto bad = std::find_if(tokens.begin(), tokens.end(),
                                [vocab_size](int32_t id) { return id < 0 || id >= vocab_size; });
  if (bad == tokens.end()) return;
  const int64_t pos = bad - tokens.begin();
  const auto& offsets = split.offsets();
  const int64_t row = std::upper_bound(offsets.begin(), offsets.end(), pos) - offsets.begin() - 1;
  const bool in_src = pos - offsets[row] < split.src_lengths()[row];
  GPT2P_FAIL(where << ": row " << row << " (" << (in_src ? "German source" : "English target")
                   << ") has token id " << *bad << ", outside the vocabulary [0, " << vocab_size
                   << ")",
             "the file is damaged or was made for another vocabulary: re-create the dataset with "
             "prepare_data for this vocabulary");
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// Writing and reading
// ------------------------------------------------------------------------------------------------
void write_dataset_file(const std::string& path, const DatasetMeta& meta,
                        const std::map<std::string, Split>& splits) {
  for (const auto& name : split_names()) {
    GPT2P_CHECK(splits.count(name) == 1,
                "cannot write " << path << ": split '" << name << "' is missing",
                "pass all of train, validation, test (an empty Split is fine)");
  }
  H5::Exception::dontPrint();  // errors are reported through gpt2p::Error instead
  // The file is built in memory (the core driver without a backing store) and its image written
  // by write_bytes_atomically. Written by HDF5 itself, a full disk fails H5Fclose's flush, and
  // HDF5 1.10 then leaves the freed file in its ID table: H5close at exit dereferences it
  // (SIGSEGV after our error line; fixed upstream in HDFGroup/hdf5#2291). In memory no HDF5 call
  // touches the disk, and every write of the image is checked (ENOSPC: a FileError saying so).
  std::string image;
  try {
    H5::FileAccPropList in_memory;
    in_memory.setCore(size_t{1} << 20, false);  // grow by 1 MiB, no backing file
    // Only a name for HDF5: one that does not exist, since HDF5 first tries to open an existing
    // file of that name (the core driver would read it into memory).
    const std::string h5_name = path + ".in-memory." + std::to_string(::getpid());
    H5::FileCreatPropList with_block;
    with_block.setUserblock(kDatasetUserBlock);
    H5::H5File file(h5_name, H5F_ACC_TRUNC, with_block, in_memory);
    set_attr(file, "format", std::string(kDatasetFormat));
    set_attr(file, "tokenizer_identity", meta.tokenizer_identity);
    set_attr(file, "vocab_size", static_cast<int64_t>(meta.vocab_size));
    set_attr(file, "eos_de_id", static_cast<int64_t>(meta.special.eos_de));
    set_attr(file, "eos_en_id", static_cast<int64_t>(meta.special.eos_en));
    set_attr(file, "pad_id", static_cast<int64_t>(meta.special.pad));
    set_attr(file, "source", meta.source);
    set_attr(file, "created", meta.created.empty() ? utc_timestamp() : meta.created);
    for (const auto& name : split_names()) {
      const Split& s = splits.at(name);
      set_attr(file, ("n_" + name).c_str(), s.size());
      H5::Group g = file.createGroup("/" + name);
      write_array(g, "tokens", H5::PredType::STD_I32LE, H5::PredType::NATIVE_INT32, s.tokens());
      write_array(g, "offsets", H5::PredType::STD_I64LE, H5::PredType::NATIVE_INT64, s.offsets());
      write_array(g, "src_lengths", H5::PredType::STD_I32LE, H5::PredType::NATIVE_INT32,
                  s.src_lengths());
      write_strings(g, "text_de", s.texts_de());
      write_strings(g, "text_en", s.texts_en());
    }
    file.flush(H5F_SCOPE_GLOBAL);
    const ssize_t size = H5Fget_file_image(file.getId(), nullptr, 0);
    if (size > 0) {
      image.resize(static_cast<size_t>(size));
      if (H5Fget_file_image(file.getId(), image.data(), image.size()) != size) image.clear();
    }
  } catch (const H5::Exception& e) {
    GPT2P_FAIL("building dataset file " << path << " in memory failed: " << e.getDetailMsg(),
               "check that the machine has free memory for the dataset");
  }
  GPT2P_CHECK(image.size() > kDatasetUserBlock,
              "building dataset file " << path << " in memory failed: HDF5 gave no file image",
              "check that the machine has free memory for the dataset");
  // HDF5 1.10's image of a core file starts at its superblock, without the user block that the
  // superblock declares: put the block in front of it.
  if (image.compare(0, kSignature.size(), kSignature) == 0) {
    image.insert(0, kDatasetUserBlock, '\0');
  }
  GPT2P_CHECK(image.compare(kDatasetUserBlock, kSignature.size(), kSignature) == 0,
              "building dataset file " << path << " in memory failed: no HDF5 superblock after "
                                       << kDatasetUserBlock << " bytes",
              "report this with the HDF5 version");
  seal_dataset_image(image);
  write_bytes_atomically(path, image);
}

DatasetFile DatasetFile::from_image(const std::string& image, const std::string& path) {
  H5::Exception::dontPrint();
  GPT2P_CHECK(image.size() > kDatasetUserBlock + kSignature.size() &&
                  image.compare(kDatasetUserBlock, kSignature.size(), kSignature) == 0,
              "dataset file " << path << " is not an HDF5 file with a " << kDatasetUserBlock
                              << "-byte block",
              "pass the .h5 file written by prepare_data");
  const auto file_size = static_cast<hsize_t>(image.size());
  DatasetFile d;
  d.path_ = path;
  try {
    // The core driver reads the image it is given. The name is only a name, but it must not
    // exist: the driver refuses to open an image under the name of an existing file.
    H5::FileAccPropList in_memory;
    in_memory.setCore(size_t{1} << 20, false);
    if (H5Pset_file_image(in_memory.getId(), const_cast<char*>(image.data()), image.size()) < 0) {
      throw H5::FileIException("H5Pset_file_image", "cannot hand the file image to HDF5");
    }
    const std::string h5_name = path + ".in-memory." + std::to_string(::getpid());
    H5::H5File file(h5_name, H5F_ACC_RDONLY, H5::FileCreatPropList::DEFAULT, in_memory);
    const std::string format =
        file.attrExists("format") ? get_str_attr(file, "format", path) : std::string("(none)");
    GPT2P_CHECK(format == kDatasetFormat,
                path << " is an HDF5 file but not a gpt2p dataset (format attribute '" << format
                     << "', expected '" << kDatasetFormat << "')",
                "pass the file written by prepare_data, or rerun prepare_data --out " << path);
    d.meta_.tokenizer_identity = get_str_attr(file, "tokenizer_identity", path);
    d.meta_.vocab_size = static_cast<int32_t>(get_int_attr(file, "vocab_size", path));
    d.meta_.special.eos_de = static_cast<int32_t>(get_int_attr(file, "eos_de_id", path));
    d.meta_.special.eos_en = static_cast<int32_t>(get_int_attr(file, "eos_en_id", path));
    d.meta_.special.pad = static_cast<int32_t>(get_int_attr(file, "pad_id", path));
    d.meta_.source = get_str_attr(file, "source", path);
    d.meta_.created = get_str_attr(file, "created", path);
    for (const auto& name : split_names()) {
      const Array a{path + ":/" + name, file_size};
      GPT2P_CHECK(file.nameExists(name), a.where << " is missing",
                  "rerun prepare_data to rebuild the dataset file");
      H5::Group g = file.openGroup(name);
      d.splits_.emplace(name,
                        Split::from_arrays(
                            read_array<int32_t>(g, "tokens", H5::PredType::NATIVE_INT32, a),
                            read_array<int64_t>(g, "offsets", H5::PredType::NATIVE_INT64, a),
                            read_array<int32_t>(g, "src_lengths", H5::PredType::NATIVE_INT32, a),
                            read_strings(g, "text_de", a), read_strings(g, "text_en", a), a.where));
      check_token_ids(d.splits_.at(name), d.meta_.vocab_size, a.where);
    }
  } catch (const H5::Exception& e) {
    GPT2P_FAIL("reading dataset file " << path << " failed: " << e.getDetailMsg(),
               "the file may be damaged: rerun prepare_data");
  }
  return d;
}

DatasetFile DatasetFile::open(const std::string& path) {
  GPT2P_CHECK(
      std::filesystem::exists(path), "dataset file " << path << " does not exist",
      "create it with prepare_data --out " << path << " (default .cache/data/ding-gpt2.h5)");
  GPT2P_CHECK(std::filesystem::is_regular_file(path),
              "dataset file " << path << " is not a regular file (a directory, device or pipe)",
              "pass the .h5 file written by prepare_data");
  const std::string image = read_sealed_dataset(path);
  // A file crafted with a valid checksum can still crash or hang libhdf5: read it in a child
  // first (core/isolated.h). What the child finishes, the parent reads the same way.
  constexpr double kProbeSeconds = 60.0;
  const IsolatedRun probe = run_isolated([&] { from_image(image, path); }, kProbeSeconds);
  if (probe.kind == IsolatedRun::Kind::kNoFork) {
    std::fprintf(stderr,
                 "warning: dataset file %s is read without isolation: the reading "
                 "process %s\n",
                 path.c_str(), probe.describe(kProbeSeconds).c_str());
    std::fflush(stderr);
  } else {
    GPT2P_CHECK(
        probe.finished(),
        "dataset file " << path << " cannot be read: the HDF5 library "
                        << probe.describe(kProbeSeconds) << " reading it",
        "the file is damaged or was crafted: re-create it with prepare_data --out " << path);
  }
  return from_image(image, path);
}

void DatasetFile::require_tokenizer(const std::string& identity, int32_t vocab_size) const {
  GPT2P_CHECK(identity == meta_.tokenizer_identity && vocab_size == meta_.vocab_size,
              "dataset " << path_ << " was made with tokenizer " << meta_.tokenizer_identity
                         << " (vocab " << meta_.vocab_size << ") but this run uses " << identity
                         << " (vocab " << vocab_size << ")",
              "rerun prepare_data with --vocab-dir pointing at this run's tokenizer files, or "
              "point this run at the vocabulary the dataset was made with");
}

const Split& DatasetFile::split(const std::string& name) const {
  const auto it = splits_.find(name);
  GPT2P_CHECK(it != splits_.end(), "dataset " << path_ << " has no split '" << name << "'",
              "use one of train, validation, test");
  return it->second;
}

}  // namespace gpt2p::data
