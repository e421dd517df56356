// gpt2_eval --data: the dataset's tokenizer must be the model's (vocabulary size, and identity when
// the vocabulary is known).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

#include "gpt2p/data/bpe_tokenizer.h"
#include "gpt2p/data/dataset_file.h"
#include "gpt2p/data/special_tokens.h"
#include "gpt2p/model/checkpoint.h"
#include "support/small_model.h"
#include "support/temp_dir.h"

namespace gpt2p::model {
namespace {

namespace fs = std::filesystem;
using gpt2p::testing::TempDir;

// gpt2_eval sits in the build directory, one level above this test binary.
std::string eval_binary() {
  return (fs::read_symlink("/proc/self/exe").parent_path().parent_path() / "gpt2_eval").string();
}

// GPT2P_VOCAB_DIR, else the repository's .cache/gpt2-vocab (scripts/setup fetches it).
std::string vocab_dir() {
  const char* env = std::getenv("GPT2P_VOCAB_DIR");
  if (env != nullptr && *env != '\0') return env;
  const char* data = std::getenv("GPT2P_TEST_DATA");
  return std::string(data != nullptr ? data : "tests/data") + "/../../.cache/gpt2-vocab";
}

std::string write_dataset(const TempDir& dir, const std::string& identity, int32_t vocab) {
  data::Split split;
  split.add({10, 11, 12}, {20, 21}, "a b c", "d e");
  split.add({30}, {40, 41}, "f", "g h");
  data::DatasetMeta meta;
  meta.tokenizer_identity = identity;
  meta.vocab_size = vocab;
  meta.source = "unit test";
  const std::string path = dir / (identity.substr(0, 4) + std::to_string(vocab) + ".h5");
  data::write_dataset_file(path, meta, {{"train", split}, {"validation", split}, {"test", split}});
  return path;
}

// Runs gpt2_eval on the checkpoint in dir/ck; returns the exit status, stdout + stderr in `text`.
int run_eval(const TempDir& dir, const std::string& flags, std::string& text) {
  const std::string cmd = eval_binary() + " --checkpoint " + (dir / "ck") + " --max-len 8 " +
                          flags + " > " + (dir / "out.txt") + " 2>&1";
  const int status = std::system(cmd.c_str());
  std::ifstream in(dir / "out.txt");
  text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return status;
}

class Gpt2EvalTokenizer : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(eval_binary())) << eval_binary() << " (build target gpt2_eval)";
    ASSERT_TRUE(fs::is_directory(vocab_dir())) << vocab_dir() << " (run scripts/setup)";
    auto tok = data::BpeTokenizer::from_dir(vocab_dir());
    data::register_special_tokens(tok);
    identity_ = tok.identity();
    vocab_ = tok.vocab_size();
    GPT2 model(gpt2p::testing::small_model(1, vocab_, 32, 2, 16));
    model->reset_parameters(4);
    save_checkpoint(dir_ / "ck", *model, nullptr, TrainState{});
  }

  TempDir dir_{"eval_cli"};
  std::string identity_;
  int32_t vocab_ = 0;
};

TEST_F(Gpt2EvalTokenizer, ADatasetOfAnotherTokenizerIsRefusedNamingBoth) {
  const std::string other = write_dataset(dir_, "gpt2-bpe:0000000000000000", vocab_);
  std::string text;
  EXPECT_NE(run_eval(dir_, "--data " + other + " --vocab-dir " + vocab_dir(), text), 0);
  EXPECT_NE(text.find("was made with tokenizer gpt2-bpe:0000000000000000 (vocab " +
                      std::to_string(vocab_) + ") but this run uses " + identity_),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("rerun prepare_data with --vocab-dir"), std::string::npos) << text;
}

TEST_F(Gpt2EvalTokenizer, TheModelsTokenizerIsAcceptedAndAMissingVocabularyIsANote) {
  const std::string mine = write_dataset(dir_, identity_, vocab_);
  std::string text;
  ASSERT_EQ(run_eval(dir_, "--data " + mine + " --vocab-dir " + vocab_dir(), text), 0) << text;
  EXPECT_NE(text.find("\"loss\""), std::string::npos) << text;
  EXPECT_EQ(text.find("note:"), std::string::npos) << text;
  ASSERT_EQ(run_eval(dir_, "--data " + mine, text), 0) << text;
  EXPECT_NE(text.find("was not checked: pass --vocab-dir"), std::string::npos) << text;
}

TEST_F(Gpt2EvalTokenizer, AVocabularySizeOtherThanTheModelsIsRefused) {
  const std::string smaller = write_dataset(dir_, identity_, vocab_ - 3);
  std::string text;
  EXPECT_NE(run_eval(dir_, "--data " + smaller, text), 0);
  EXPECT_NE(text.find("(vocab " + std::to_string(vocab_ - 3) + ") but the model of --checkpoint"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("has vocab " + std::to_string(vocab_)), std::string::npos) << text;
}

}  // namespace
}  // namespace gpt2p::model
