#include "gpt2p/model/hf_checkpoint.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "gpt2p/core/atomic_file.h"
#include "gpt2p/core/error.h"
#include "gpt2p/io/json_input.h"
#include "gpt2p/model/safetensors.h"

namespace gpt2p::model {

namespace fs = std::filesystem;

namespace {
constexpr const char* kPrefix = "transformer.";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// HF's Conv1D layers keep weights as [in, out].
bool is_conv1d_weight(const std::string& name) {
  return ends_with(name, "attn.c_attn.weight") || ends_with(name, "attn.c_proj.weight") ||
         ends_with(name, "mlp.c_fc.weight") || ends_with(name, "mlp.c_proj.weight");
}

nlohmann::json read_json(const std::string& path) {
  auto j = io::read_json_file(path, "fix or re-create the file (a GPT-2 checkpoint's config.json)");
  GPT2P_CHECK(j.is_object(), path << " is " << io::json_type_name(j) << ", not a JSON object",
              "fix or re-create the file (a GPT-2 checkpoint's config.json)");
  return j;
}

double hf_float(const nlohmann::json& j, const char* key, const std::string& path) {
  GPT2P_CHECK(
      j[key].is_number(),
      path << ": field '" << key << "' is " << io::json_type_name(j[key]) << ", not a number",
      "fix or re-create the file");
  return j[key].get<double>();
}

int64_t hf_int(const nlohmann::json& j, const char* key, const std::string& path) {
  GPT2P_CHECK(j.contains(key) && j[key].is_number_integer(),
              path << ": field '" << key << "' is missing or not an integer",
              "a GPT-2 config.json has n_layer, n_head, n_embd, n_positions and vocab_size");
  return j[key].get<int64_t>();
}
}  // namespace

bool is_hf_dir(const std::string& dir) {
  return fs::is_regular_file(fs::path(dir) / "config.json") &&
         fs::is_regular_file(fs::path(dir) / "model.safetensors");
}

GPT2Config read_hf_config(const std::string& dir, int64_t extra_vocab) {
  const std::string path = (fs::path(dir) / "config.json").string();
  const auto j = read_json(path);
  if (j.contains("model_type")) {
    GPT2P_CHECK(j["model_type"] == "gpt2",
                path << ": model_type is " << j["model_type"].dump() << ", not \"gpt2\"",
                "only GPT-2 checkpoints can be imported");
  }
  if (j.contains("activation_function")) {
    GPT2P_CHECK(
        j["activation_function"] == "gelu_new",
        path << ": activation_function " << j["activation_function"].dump() << " is not supported",
        "our blocks use tanh-GELU (\"gelu_new\"), as every released GPT-2 does");
  }
  GPT2Config c;
  c.n_layer = hf_int(j, "n_layer", path);
  c.n_head = hf_int(j, "n_head", path);
  c.n_embd = hf_int(j, "n_embd", path);
  c.n_ctx = hf_int(j, "n_positions", path);
  c.vocab_size = hf_int(j, "vocab_size", path) + extra_vocab;
  if (j.contains("layer_norm_epsilon")) c.layer_norm_eps = hf_float(j, "layer_norm_epsilon", path);
  if (j.contains("resid_pdrop")) c.dropout = hf_float(j, "resid_pdrop", path);
  c.validate();
  return c;
}

// config.json must describe `model`'s shape (the vocabulary may be smaller: import_hf fills the
// extra rows). Returns the file's config.
GPT2Config check_hf_config(const std::string& dir, const GPT2Config& model) {
  const std::string path = (fs::path(dir) / "config.json").string();
  const GPT2Config hf = read_hf_config(dir);
  const struct {
    const char* field;
    int64_t file, ours;
  } fields[] = {{"n_layer", hf.n_layer, model.n_layer},
                {"n_head", hf.n_head, model.n_head},
                {"n_embd", hf.n_embd, model.n_embd},
                {"n_positions", hf.n_ctx, model.n_ctx}};
  for (const auto& f : fields) {
    GPT2P_CHECK(f.file == f.ours,
                path << ": " << f.field << " is " << f.file
                     << " but the model being initialised has " << f.ours,
                "build the model with the checkpoint's shape (--preset or --n-layer/--n-head/"
                "--n-embd, and a --seq-len within n_positions), or initialise from a checkpoint "
                "of this shape");
  }
  GPT2P_CHECK(hf.vocab_size <= model.vocab_size,
              path << ": vocab_size is " << hf.vocab_size << " but the model being initialised has "
                   << model.vocab_size,
              "initialise from a GPT-2 checkpoint whose vocabulary the model's contains");
  return hf;
}

void import_hf(const std::string& dir, GPT2Impl& model) {
  const GPT2Config hf = check_hf_config(dir, model.config());
  const std::string path = (fs::path(dir) / "model.safetensors").string();
  const auto file = read_safetensors(path);
  auto find = [&](const std::string& ours) -> const torch::Tensor* {
    for (const std::string& name : {kPrefix + ours, ours}) {
      if (auto it = file.tensors.find(name); it != file.tensors.end()) return &it->second;
    }
    return nullptr;
  };
  const GPT2Config& cfg = model.config();
  torch::NoGradGuard no_grad;
  std::set<const torch::Tensor*> used;
  for (auto& item : model.named_parameters()) {
    const std::string& name = item.key();
    torch::Tensor& param = item.value();
    const torch::Tensor* src = find(name);
    GPT2P_CHECK(src != nullptr,
                path << " has no tensor '" << kPrefix << name << "' (nor '" << name << "')",
                "the file is not a GPT-2 checkpoint of this depth (" << cfg.n_layer << " layers)");
    used.insert(src);
    GPT2P_CHECK(!src->is_floating_point() || torch::isfinite(*src).all().item<bool>(),
                path << ": tensor '" << name << "' holds NaN or Inf",
                "the file was written by a run that had diverged or was damaged; use another copy");
    torch::Tensor value = is_conv1d_weight(name) ? src->t() : *src;
    if (name == "wte.weight") {
      const int64_t hf_vocab = value.size(0);
      GPT2P_CHECK(hf_vocab == hf.vocab_size,
                  path << ": wte has " << hf_vocab << " rows but config.json says vocab_size "
                       << hf.vocab_size,
                  "the two files do not belong together: re-export the checkpoint "
                  "(save_pretrained) or fix vocab_size in config.json");
      GPT2P_CHECK(value.dim() == 2 && value.size(1) == cfg.n_embd && hf_vocab <= cfg.vocab_size,
                  path << ": wte is " << value.sizes() << ", the model needs at most ["
                       << cfg.vocab_size << ", " << cfg.n_embd << "]",
                  "build the model from the checkpoint's config (read_hf_config)");
      const auto rows = param.narrow(0, 0, hf_vocab);
      rows.copy_(value);
      if (cfg.vocab_size > hf_vocab) {
        param.narrow(0, hf_vocab, cfg.vocab_size - hf_vocab)
            .copy_(value.to(torch::kFloat64)
                       .mean(0, /*keepdim=*/true)
                       .expand({cfg.vocab_size - hf_vocab, cfg.n_embd}));
      }
      param.narrow(0, cfg.vocab_size, cfg.padded_vocab_size() - cfg.vocab_size).zero_();
      if (const auto it = file.tensors.find("lm_head.weight"); it != file.tensors.end()) {
        GPT2P_CHECK(it->second.sizes() == value.sizes() && torch::equal(it->second, value),
                    path << ": lm_head.weight differs from wte.weight",
                    "our GPT-2 ties the head to the embedding; untied checkpoints cannot be "
                    "imported");
      }
      continue;
    }
    GPT2P_CHECK(value.sizes() == param.sizes(),
                path << ": tensor '" << name << "' has shape " << value.sizes()
                     << " (after the Conv1D transpose), the model's is " << param.sizes(),
                "build the model from the checkpoint's config (read_hf_config)");
    param.copy_(value);
  }
  // Every tensor must have found its parameter: a config.json that says fewer layers than the
  // weights hold would otherwise evaluate part of the model. HF's files may also hold the
  // attention's causal-mask buffers and the head tied to wte (checked above).
  for (const auto& [name, t] : file.tensors) {
    const bool buffer = ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias") ||
                        name == "lm_head.weight";
    GPT2P_CHECK(buffer || used.count(&t) != 0U,
                path << " holds tensor '" << name << "' " << t.sizes()
                     << " that a GPT-2 of config.json's shape (" << cfg.n_layer
                     << " layers) does not have",
                "config.json does not describe these weights: fix n_layer (and the other sizes) "
                "or use the config.json that came with them");
  }
}

GPT2 load_hf(const std::string& dir, int64_t extra_vocab) {
  const GPT2Config config = read_hf_config(dir, extra_vocab);
  const fs::path weights = fs::path(dir) / "model.safetensors";
  GPT2P_CHECK(fs::is_regular_file(weights), dir << " has no model.safetensors (a regular file)",
              "pass a Hugging Face GPT-2 directory (config.json and model.safetensors)");
  check_config_fits_weights(config, 0, config.num_stage_layers(), config.vocab_size - extra_vocab,
                            fs::file_size(weights), (fs::path(dir) / "config.json").string(),
                            weights.string());
  GPT2 model(config);
  import_hf(dir, *model);
  return model;
}

void export_hf(const std::string& dir, const GPT2Impl& model) {
  GPT2P_CHECK(model.is_full(),
              "cannot export stage [" << model.range().begin << ", " << model.range().end
                                      << ") to Hugging Face format",
              "export the full model (gather the stages into one GPT2 first)");
  const GPT2Config& c = model.config();
  std::map<std::string, torch::Tensor> tensors;
  for (const auto& item : model.named_parameters()) {
    torch::Tensor t = item.value().detach().to(torch::kCPU, torch::kFloat32);
    if (item.key() == "wte.weight") t = t.narrow(0, 0, c.vocab_size);
    if (is_conv1d_weight(item.key())) t = t.t();
    tensors.emplace(kPrefix + item.key(), t.contiguous());
  }
  const nlohmann::json config = {{"model_type", "gpt2"},
                                 {"architectures", {"GPT2LMHeadModel"}},
                                 {"n_layer", c.n_layer},
                                 {"n_head", c.n_head},
                                 {"n_embd", c.n_embd},
                                 {"n_positions", c.n_ctx},
                                 {"n_ctx", c.n_ctx},
                                 {"vocab_size", c.vocab_size},
                                 {"layer_norm_epsilon", c.layer_norm_eps},
                                 {"activation_function", "gelu_new"},
                                 {"resid_pdrop", c.dropout},
                                 {"embd_pdrop", c.dropout},
                                 {"attn_pdrop", c.dropout},
                                 {"initializer_range", 0.02},
                                 {"bos_token_id", kGpt2BaseVocab - 1},
                                 {"eos_token_id", kGpt2BaseVocab - 1},
                                 {"tie_word_embeddings", true},
                                 {"torch_dtype", "float32"}};
  write_dir_atomically(dir, [&](const std::string& tmp) {
    write_safetensors((fs::path(tmp) / "model.safetensors").string(), tensors, {{"format", "pt"}});
    write_text_atomically((fs::path(tmp) / "config.json").string(), config.dump(2) + "\n");
  });
}

}  // namespace gpt2p::model
