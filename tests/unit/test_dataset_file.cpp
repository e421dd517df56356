// The prepared dataset file: round trip, atomic write, and the errors that name the fix.
#include <H5Cpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "gpt2p/core/error.h"
#include "gpt2p/data/dataset_file.h"
#include "gpt2p/data/dataset_seal.h"
#include "support/errors.h"
#include "support/tmpfs.h"

namespace gpt2p::data {
namespace {

using gpt2p::testing::error_with_hint;

namespace fs = std::filesystem;

std::string temp_path(const std::string& name) {
  // One folder per test process: ctest runs the cases of this file in parallel.
  const fs::path dir =
      fs::path(::testing::TempDir()) / ("gpt2p_dataset_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return (dir / name).string();
}

std::map<std::string, Split> sample_splits() {
  std::map<std::string, Split> s;
  s["train"].add({1, 2, 3}, {4, 5}, "Hallo Welt.", "Hello world.");
  s["train"].add({6}, {7, 8, 9}, "Größe ändern?", "Resize?");
  s["train"].add({}, {10}, "", "x");
  s["validation"].add({11, 12}, {13}, "Ja.", "Yes.");
  s["test"];  // empty split
  return s;
}

DatasetMeta sample_meta() {
  DatasetMeta m;
  m.tokenizer_identity = "gpt2-bpe:0123456789abcdef";
  m.vocab_size = 50260;
  m.source = "unit test";
  m.created = "2024-01-01T00:00:00Z";
  return m;
}

TEST(Split, AddAndSpans) {
  const auto s = sample_splits().at("train");
  ASSERT_EQ(s.size(), 3);
  EXPECT_EQ(s.src(0).to_vector(), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(s.tgt(0).to_vector(), (std::vector<int32_t>{4, 5}));
  EXPECT_EQ(s.src(1).to_vector(), (std::vector<int32_t>{6}));
  EXPECT_EQ(s.tgt(1).to_vector(), (std::vector<int32_t>{7, 8, 9}));
  EXPECT_EQ(s.src(2).size(), 0U);
  EXPECT_EQ(s.offsets(), (std::vector<int64_t>{0, 5, 9, 10}));
  EXPECT_EQ(s.src_tokens(), 4);
  EXPECT_EQ(s.tgt_tokens(), 6);
  EXPECT_EQ(s.text_de(1), "Größe ändern?");
  const auto text = error_with_hint([&] { s.src(3); });
  EXPECT_NE(text.find("example index 3 is out of range [0, 3)"), std::string::npos) << text;
}

TEST(Split, FromArraysChecksConsistency) {
  const auto text = error_with_hint([] {
    Split::from_arrays({1, 2}, {0, 2}, {3}, {"a"}, {"b"}, "f.h5:/train");
  });
  EXPECT_NE(text.find("f.h5:/train: example 0 has src length 3 but only 2 tokens"),
            std::string::npos)
      << text;
  const auto text2 = error_with_hint([] {
    Split::from_arrays({1, 2}, {0, 1}, {1}, {"a"}, {"b"}, "f.h5:/test");
  });
  EXPECT_NE(text2.find("offsets run from 0 to 1 but there are 2 tokens"), std::string::npos)
      << text2;
}

TEST(DatasetFile, RoundTrip) {
  const auto path = temp_path("round_trip.h5");
  auto meta = sample_meta();
  meta.special = SpecialTokens{100, 101, 102};
  write_dataset_file(path, meta, sample_splits());
  EXPECT_FALSE(fs::exists(path + ".tmp." + std::to_string(::getpid())));

  const auto d = DatasetFile::open(path);
  EXPECT_EQ(d.meta().tokenizer_identity, meta.tokenizer_identity);
  EXPECT_EQ(d.meta().vocab_size, 50260);
  EXPECT_EQ(d.meta().special.eos_de, 100);
  EXPECT_EQ(d.meta().special.eos_en, 101);
  EXPECT_EQ(d.meta().special.pad, 102);
  EXPECT_EQ(d.meta().source, "unit test");
  EXPECT_EQ(d.meta().created, "2024-01-01T00:00:00Z");
  const auto want = sample_splits();
  for (const std::string name : {"train", "validation", "test"}) {
    const Split& got = d.split(name);
    EXPECT_EQ(got.tokens(), want.at(name).tokens()) << name;
    EXPECT_EQ(got.offsets(), want.at(name).offsets()) << name;
    EXPECT_EQ(got.src_lengths(), want.at(name).src_lengths()) << name;
    EXPECT_EQ(got.texts_de(), want.at(name).texts_de()) << name;
    EXPECT_EQ(got.texts_en(), want.at(name).texts_en()) << name;
  }
  EXPECT_EQ(d.split("train").tgt(1).to_vector(), (std::vector<int32_t>{7, 8, 9}));
  EXPECT_EQ(d.split("test").size(), 0);

  // Counts are root attributes too.
  H5::H5File f(path, H5F_ACC_RDONLY);
  int64_t n_train = 0;
  f.openAttribute("n_train").read(H5::PredType::NATIVE_INT64, &n_train);
  EXPECT_EQ(n_train, 3);
}

TEST(DatasetFile, RewriteReplacesAtomically) {
  const auto path = temp_path("rewrite.h5");
  write_dataset_file(path, sample_meta(), sample_splits());
  auto splits = sample_splits();
  splits["test"].add({42}, {43}, "Neu.", "New.");
  write_dataset_file(path, sample_meta(), splits);
  EXPECT_EQ(DatasetFile::open(path).split("test").size(), 1);
  // A failing write leaves the previous file intact and no temporary behind.
  splits.erase("validation");
  const auto text = error_with_hint([&] { write_dataset_file(path, sample_meta(), splits); });
  EXPECT_NE(text.find("split 'validation' is missing"), std::string::npos) << text;
  EXPECT_EQ(DatasetFile::open(path).split("test").size(), 1);
  for (const auto& e : fs::directory_iterator(fs::path(path).parent_path()))
    EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << e.path();
}

TEST(DatasetFile, TokenizerMismatchSaysWhatToRerun) {
  const auto path = temp_path("mismatch.h5");
  write_dataset_file(path, sample_meta(), sample_splits());
  const auto d = DatasetFile::open(path);
  EXPECT_NO_THROW(d.require_tokenizer("gpt2-bpe:0123456789abcdef", 50260));
  const auto text =
      error_with_hint([&] { d.require_tokenizer("gpt2-bpe:ffffffffffffffff", 50261); });
  EXPECT_NE(text.find("dataset " + path +
                      " was made with tokenizer gpt2-bpe:0123456789abcdef (vocab 50260) but this "
                      "run uses gpt2-bpe:ffffffffffffffff (vocab 50261)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("rerun prepare_data with --vocab-dir"), std::string::npos) << text;
  const auto text2 =
      error_with_hint([&] { d.require_tokenizer("gpt2-bpe:0123456789abcdef", 50257); });
  EXPECT_NE(text2.find("(vocab 50257)"), std::string::npos) << text2;
  const auto text3 = error_with_hint([&] { d.split("dev"); });
  EXPECT_NE(text3.find("has no split 'dev'"), std::string::npos) << text3;
}

TEST(DatasetFile, TokenIdsOutsideTheVocabularyNameFileSplitRowAndId) {
  const auto path = temp_path("bad_ids.h5");
  auto splits = sample_splits();
  splits["validation"].add({14}, {15, 50260}, "Nein.", "No.");  // row 1, a target id == vocab
  write_dataset_file(path, sample_meta(), splits);
  const auto text = error_with_hint([&] { DatasetFile::open(path); });
  EXPECT_NE(text.find(path + ":/validation: row 1 (English target) has token id 50260, outside "
                             "the vocabulary [0, 50260)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("re-create the dataset with prepare_data for this vocabulary"),
            std::string::npos)
      << text;
  splits = sample_splits();
  splits["train"].add({-3}, {1}, "a", "b");
  write_dataset_file(path, sample_meta(), splits);
  const auto text2 = error_with_hint([&] { DatasetFile::open(path); });
  EXPECT_NE(text2.find(":/train: row 3 (German source) has token id -3"), std::string::npos)
      << text2;
}

TEST(DatasetFile, AFullDiskIsOneErrorAndLeavesNoFile) {
  // HDF5 1.10, writing to the disk itself, crashed at exit after a failed flush (H5close on a
  // freed file): this process would then end with SIGSEGV after the test passed.
  testing::Tmpfs tmpfs("size=256k");
  if (!tmpfs.mounted()) GTEST_SKIP() << "cannot mount a tmpfs: " << tmpfs.error();
  auto splits = sample_splits();
  for (int i = 0; i < 4000; ++i) {
    splits["train"].add(std::vector<int32_t>(20, 7), std::vector<int32_t>(20, 9),
                        "ein langer Satz " + std::to_string(i), "a long sentence");
  }
  const std::string path = tmpfs / "d.h5";
  const auto msg = error_with_hint([&] { write_dataset_file(path, sample_meta(), splits); });
  EXPECT_NE(msg.find("no space left on device writing " + path + ".tmp."), std::string::npos)
      << msg;
  EXPECT_EQ(tmpfs.entries(), 0) << "no d.h5 and no d.h5.tmp.*";
}

TEST(DatasetFile, OpenErrors) {
  const auto missing = error_with_hint([] { DatasetFile::open("/nonexistent/d.h5"); });
  EXPECT_NE(missing.find("dataset file /nonexistent/d.h5 does not exist"), std::string::npos)
      << missing;
  EXPECT_NE(missing.find("prepare_data --out"), std::string::npos) << missing;

  // Every file is checked against the checksum block prepare_data writes before HDF5 reads it:
  // libhdf5 itself crashes on some damaged files.
  const auto text_file = temp_path("not_hdf5.h5");
  std::ofstream(text_file) << "hello";
  const auto not_h5 = error_with_hint([&] { DatasetFile::open(text_file); });
  EXPECT_NE(not_h5.find(text_file + " has no gpt2p checksum block"), std::string::npos) << not_h5;
  EXPECT_NE(not_h5.find("re-create it with prepare_data --out " + text_file), std::string::npos)
      << not_h5;

  const auto other = temp_path("other.h5");  // HDF5, but not written by prepare_data
  { H5::H5File f(other, H5F_ACC_TRUNC); }
  const auto not_ours = error_with_hint([&] { DatasetFile::open(other); });
  EXPECT_NE(not_ours.find("has no gpt2p checksum block"), std::string::npos) << not_ours;

  const auto path = temp_path("flipped.h5");
  write_dataset_file(path, sample_meta(), sample_splits());
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  ASSERT_GT(bytes.size(), 1024U);
  EXPECT_EQ(bytes.compare(0, 16, "gpt2p-dataset 1 "), 0);
  bytes[bytes.size() / 2] ^= 0x40;
  std::ofstream(path, std::ios::binary) << bytes;
  const auto flipped = error_with_hint([&] { DatasetFile::open(path); });
  EXPECT_NE(flipped.find(path + " does not match its checksum"), std::string::npos) << flipped;
  bytes[bytes.size() / 2] ^= 0x40;
  std::ofstream(path, std::ios::binary) << bytes;
  EXPECT_NO_THROW(DatasetFile::open(path));
  std::ofstream(path, std::ios::binary) << bytes.substr(0, bytes.size() - 10);
  EXPECT_NE(error_with_hint([&] { DatasetFile::open(path); }).find("does not match its checksum"),
            std::string::npos);
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(DatasetSeal, SealedImagesReadBackAndEveryByteIsCovered) {
  const auto path = temp_path("sealed.h5");
  write_dataset_file(path, sample_meta(), sample_splits());
  std::string bytes = read_bytes(path);
  EXPECT_EQ(read_sealed_dataset(path), bytes);
  std::string resealed = bytes;
  seal_dataset_image(resealed);
  EXPECT_EQ(resealed, bytes);  // sealing is a function of the bytes after the block
  // The last byte is covered too.
  bytes.back() ^= 1;
  std::ofstream(path, std::ios::binary) << bytes;
  EXPECT_NE(error_with_hint([&] { read_sealed_dataset(path); }).find("does not match its checksum"),
            std::string::npos);
  std::string small(kDatasetUserBlock, '\0');
  EXPECT_NE(error_with_hint([&] { seal_dataset_image(small); }).find("has nothing after"),
            std::string::npos);
}

// A file crafted with a valid checksum reaches HDF5: whatever it holds, open() ends in a dataset
// or one error line (a crash or hang of libhdf5 itself is caught in a child process).
TEST(DatasetFile, CraftedFilesWithValidChecksumsEndInADatasetOrAnError) {
  const auto path = temp_path("crafted.h5");
  write_dataset_file(path, sample_meta(), sample_splits());
  const std::string good = read_bytes(path);
  int refused = 0;
  for (size_t at = kDatasetUserBlock; at < good.size(); at += 97) {
    std::string bytes = good;
    bytes[at] = static_cast<char>(bytes[at] ^ 0xff);
    seal_dataset_image(bytes);
    std::ofstream(path, std::ios::binary) << bytes;
    try {
      const DatasetFile d = DatasetFile::open(path);
      EXPECT_EQ(d.split("train").size() + d.split("validation").size(), 4) << "byte " << at;
    } catch (const Error& e) {
      ++refused;
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
  }
  EXPECT_GT(refused, 0);
}

}  // namespace
}  // namespace gpt2p::data
