// import_hf (--init-from a Hugging Face directory) reads config.json and refuses one that does not
// describe the model being initialised.
#include <gtest/gtest.h>

#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "gpt2p/core/error.h"
#include "gpt2p/model/hf_checkpoint.h"
#include "gpt2p/model/safetensors.h"
#include "support/errors.h"
#include "support/small_model.h"
#include "support/temp_dir.h"

namespace gpt2p::model {
namespace {

using gpt2p::testing::error_with_hint;
using gpt2p::testing::TempDir;

GPT2Config config() { return gpt2p::testing::small_model(1, 100, 16, 2, 16); }

class HfConfigJson : public ::testing::Test {
 protected:
  void SetUp() override {
    GPT2 source(config());
    source->reset_parameters(3);
    export_hf(dir_ / "hf", *source);
  }

  // Rewrites config.json with `change` applied to the exported one.
  template <class F>
  void edit(F change) {
    auto j = nlohmann::json::parse(std::ifstream(dir_ / "hf/config.json"));
    change(j);
    std::ofstream(dir_ / "hf/config.json") << j.dump(2);
  }

  std::string import_error(const GPT2Config& target) {
    GPT2 model(target);
    return error_with_hint([&] { import_hf(dir_ / "hf", *model); });
  }

  TempDir dir_{"hf_config"};
};

TEST_F(HfConfigJson, AMatchingConfigImports) {
  EXPECT_EQ(import_error(config()), "(no error)");
  auto bigger_vocab = config();
  bigger_vocab.vocab_size = 103;  // our specials on top of the file's vocabulary
  EXPECT_EQ(import_error(bigger_vocab), "(no error)");
}

TEST_F(HfConfigJson, InvalidJsonIsNamed) {
  std::ofstream(dir_ / "hf/config.json") << "{\"n_layer\": 1,";
  const auto text = import_error(config());
  EXPECT_NE(text.find("hf/config.json: not valid JSON"), std::string::npos) << text;
  EXPECT_NE(text.find("fix or re-create the file"), std::string::npos) << text;
}

TEST_F(HfConfigJson, AMissingFieldIsNamed) {
  edit([](nlohmann::json& j) { j.erase("n_head"); });
  const auto text = import_error(config());
  EXPECT_NE(text.find("field 'n_head' is missing or not an integer"), std::string::npos) << text;
}

TEST_F(HfConfigJson, AShapeOtherThanTheModelsNamesTheFieldAndBothValues) {
  edit([](nlohmann::json& j) { j["n_layer"] = 3; });
  auto text = import_error(config());
  EXPECT_NE(text.find("config.json: n_layer is 3 but the model being initialised has 1"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("build the model with the checkpoint's shape"), std::string::npos) << text;
  edit([](nlohmann::json& j) {
    j["n_layer"] = 1;
    j["n_positions"] = 32;
  });
  text = import_error(config());
  EXPECT_NE(text.find("n_positions is 32 but the model being initialised has 16"),
            std::string::npos)
      << text;
}

TEST_F(HfConfigJson, AConfigOfFewerLayersThanTheWeightsIsRefused) {
  auto two = config();
  two.n_layer = 2;
  GPT2 source(two);
  source->reset_parameters(4);
  export_hf(dir_ / "hf2", *source);
  auto j = nlohmann::json::parse(std::ifstream(dir_ / "hf2/config.json"));
  j["n_layer"] = 1;
  std::ofstream(dir_ / "hf2/config.json") << j.dump(2);
  const auto text = error_with_hint([&] { load_hf(dir_ / "hf2"); });
  EXPECT_NE(text.find("model.safetensors holds tensor '"), std::string::npos) << text;
  EXPECT_NE(text.find("h.1."), std::string::npos) << text;
  EXPECT_NE(text.find("config.json's shape (1 layers) does not have"), std::string::npos) << text;
}

TEST_F(HfConfigJson, NaNWeightsAreNamedWithTheirFile) {
  auto file = read_safetensors(dir_ / "hf/model.safetensors");
  auto& wpe = file.tensors.begin()->second;
  wpe.view(-1)[0] = std::numeric_limits<float>::quiet_NaN();
  write_safetensors(dir_ / "hf/model.safetensors", file.tensors, file.metadata);
  const auto text = import_error(config());
  EXPECT_NE(text.find("hf/model.safetensors: tensor '"), std::string::npos) << text;
  EXPECT_NE(text.find("' holds NaN or Inf"), std::string::npos) << text;
}

TEST_F(HfConfigJson, AVocabularyLargerThanTheModelsOrTheWeightsIsRefused) {
  auto smaller = config();
  smaller.vocab_size = 90;
  auto text = import_error(smaller);
  EXPECT_NE(text.find("vocab_size is 100 but the model being initialised has 90"),
            std::string::npos)
      << text;
  edit([](nlohmann::json& j) { j["vocab_size"] = 99; });
  text = import_error(config());
  EXPECT_NE(text.find("wte has 100 rows but config.json says vocab_size 99"), std::string::npos)
      << text;
}

}  // namespace
}  // namespace gpt2p::model
