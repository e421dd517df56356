#include "gpt2p/model/checkpoint.h"

#include <filesystem>
#include <fstream>
#include <set>

#include "gpt2p/core/atomic_file.h"
#include "gpt2p/core/error.h"
#include "gpt2p/model/safetensors.h"

namespace gpt2p::model {

namespace fs = std::filesystem;

namespace {
constexpr const char* kFormat = "gpt2p-checkpoint";
constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimizerFile = "optimizer.pt";
constexpr const char* kMetaFile = "meta.json";

std::string to_hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) {
    out.push_back(digits[b >> 4]);
    out.push_back(digits[b & 15]);
  }
  return out;
}

std::string from_hex(const std::string& hex, const std::string& where) {
  auto nibble = [&](char ch) -> int {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    GPT2P_FAIL(where << ": rng_state contains '" << ch << "', not a hex digit",
               "the checkpoint's meta.json was edited or is corrupt");
  };
  GPT2P_CHECK(hex.size() % 2 == 0, where << ": rng_state has an odd number of hex digits",
              "the checkpoint's meta.json was edited or is corrupt");
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<char>(nibble(hex[2 * i]) * 16 + nibble(hex[2 * i + 1]));
  }
  return out;
}

nlohmann::json read_meta(const std::string& dir) {
  const std::string path = (fs::path(dir) / kMetaFile).string();
  std::ifstream in(path);
  GPT2P_CHECK(in.good(), "checkpoint " << dir << " has no " << kMetaFile,
              "pass a directory written by save_checkpoint (or a Hugging Face directory where "
              "one is accepted)");
  nlohmann::json meta;
  try {
    meta = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    GPT2P_FAIL(path << " is not valid JSON: " << e.what(), "the checkpoint is corrupt");
  }
  GPT2P_CHECK(
      meta.value("format", "") == kFormat,
      path << " is not a gpt2p checkpoint (format " << meta.value("format", "<none>") << ")",
      "pass a directory written by save_checkpoint");
  return meta;
}
}  // namespace

void save_checkpoint(const std::string& dir, const GPT2Impl& model,
                     const torch::optim::Optimizer* optimizer, const TrainState& state) {
  std::map<std::string, torch::Tensor> params;
  for (const auto& item : model.named_parameters()) params.emplace(item.key(), item.value());
  const nlohmann::json meta = {{"format", kFormat},
                               {"model_config", to_json(model.config())},
                               {"layer_range", {model.range().begin, model.range().end}},
                               {"step", state.step},
                               {"epoch", state.epoch},
                               {"batch_in_epoch", state.batch_in_epoch},
                               {"seed", state.seed},
                               {"rng_state", to_hex(state.rng_state)},
                               {"config", state.config}};
  write_dir_atomically(dir, [&](const std::string& tmp) {
    write_safetensors((fs::path(tmp) / kModelFile).string(), params);
    if (optimizer != nullptr) {
      torch::serialize::OutputArchive archive;
      optimizer->save(archive);
      archive.save_to((fs::path(tmp) / kOptimizerFile).string());
    }
    write_text_atomically((fs::path(tmp) / kMetaFile).string(), meta.dump(2) + "\n");
  });
}

TrainState load_checkpoint(const std::string& dir, GPT2Impl& model,
                           torch::optim::Optimizer* optimizer) {
  const TrainState state = read_train_state(dir);
  const auto file = read_safetensors((fs::path(dir) / kModelFile).string());
  std::set<std::string> used;
  {
    torch::NoGradGuard no_grad;
    for (auto& item : model.named_parameters()) {
      const auto it = file.tensors.find(item.key());
      GPT2P_CHECK(it != file.tensors.end(),
                  "checkpoint " << dir << " has no parameter '" << item.key() << "' (model shape "
                                << item.value().sizes() << ")",
                  "the checkpoint holds other layers or another model: build the model from "
                  "checkpoint_config()/checkpoint_range() of "
                      << dir);
      GPT2P_CHECK(it->second.sizes() == item.value().sizes(),
                  "checkpoint " << dir << ": parameter '" << item.key() << "' has shape "
                                << it->second.sizes() << " in the file but " << item.value().sizes()
                                << " in the model",
                  "build the model with the checkpoint's config ("
                      << describe(checkpoint_config(dir))
                      << "), e.g. with load_model(), or pass the matching --model flags");
      item.value().copy_(it->second);
      used.insert(item.key());
    }
  }
  // A stage may take its layers from a bigger checkpoint; a full model must use every tensor.
  for (const auto& [name, t] : file.tensors) {
    GPT2P_CHECK(!model.is_full() || used.count(name) != 0U,
                "checkpoint " << dir << " has parameter '" << name << "' " << t.sizes()
                              << " that the model (layers [" << model.range().begin << ", "
                              << model.range().end << ")) does not have",
                "build the model with the checkpoint's layer range and config (load_model())");
  }
  if (optimizer != nullptr) {
    const std::string path = (fs::path(dir) / kOptimizerFile).string();
    GPT2P_CHECK(fs::exists(path), "checkpoint " << dir << " has no optimizer state " << path,
                "it was saved without an optimizer: pass a null optimizer to load only weights");
    torch::serialize::InputArchive archive;
    archive.load_from(path);
    optimizer->load(archive);
  }
  return state;
}

bool is_checkpoint_dir(const std::string& dir) {
  const fs::path path = fs::path(dir) / kMetaFile;
  if (!fs::is_regular_file(path)) return false;
  std::ifstream in(path);
  const auto meta = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  return meta.is_object() && meta.value("format", "") == kFormat;
}

GPT2Config checkpoint_config(const std::string& dir) {
  return config_from_json(read_meta(dir).at("model_config"));
}

LayerRange checkpoint_range(const std::string& dir) {
  const auto r = read_meta(dir).at("layer_range");
  return LayerRange{r.at(0).get<int64_t>(), r.at(1).get<int64_t>()};
}

TrainState read_train_state(const std::string& dir) {
  const auto meta = read_meta(dir);
  TrainState s;
  try {
    s.step = meta.at("step").get<int64_t>();
    s.epoch = meta.at("epoch").get<int64_t>();
    s.batch_in_epoch = meta.at("batch_in_epoch").get<int64_t>();
    s.seed = meta.at("seed").get<uint64_t>();
    s.rng_state = from_hex(meta.at("rng_state").get<std::string>(), dir);
    s.config = meta.value("config", nlohmann::json());
  } catch (const nlohmann::json::exception& e) {
    GPT2P_FAIL("checkpoint " << dir << ": " << kMetaFile << " is incomplete: " << e.what(),
               "the checkpoint is corrupt or from another version; re-create it");
  }
  return s;
}

GPT2 load_model(const std::string& dir) {
  GPT2 model(checkpoint_config(dir), checkpoint_range(dir));
  load_checkpoint(dir, *model, nullptr);
  return model;
}

}  // namespace gpt2p::model
