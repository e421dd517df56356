#include "gpt2p/model/model_dir.h"

#include <filesystem>
#include <map>

#include "gpt2p/core/error.h"
#include "gpt2p/io/json_input.h"
#include "gpt2p/model/hf_checkpoint.h"

namespace gpt2p::model {
namespace {

namespace fs = std::filesystem;

// Stages join when they share one config and their layer ranges follow each other from the
// embedding to the head.
GPT2 join_stages(const std::string& dir, const LoadOptions& options) {
  const auto manifest = read_checkpoint_manifest(dir);
  const int64_t stages = io::json_int_field(manifest, "stages", 1, 1 << 16, dir + "/manifest.json",
                                            "the checkpoint is corrupt: use an earlier copy");
  std::vector<GPT2> parts;
  for (int64_t s = 0; s < stages; ++s) {
    const std::string stage = dir + "/stage" + std::to_string(s);
    GPT2P_CHECK(is_checkpoint_dir(stage),
                "pipeline checkpoint " << dir << " lists " << stages << " stages but " << stage
                                       << " is not a checkpoint",
                "the checkpoint is incomplete: use an earlier copy");
    parts.push_back(load_model(stage, options));
    const auto& first = parts.front();
    const auto& part = parts.back();
    GPT2P_CHECK(part->config() == first->config(),
                stage << " holds a model of another config than " << dir << "/stage0",
                "the stages come from different runs: use a checkpoint one run wrote whole");
    const int64_t expected = s == 0 ? 0 : parts[parts.size() - 2]->range().end;
    GPT2P_CHECK(part->range().begin == expected,
                stage << " holds layers [" << part->range().begin << ", " << part->range().end
                      << ") but the stages before it end at layer " << expected,
                "the stages come from different runs: use a checkpoint one run wrote whole");
  }
  const GPT2Config config = parts.front()->config();
  GPT2P_CHECK(parts.back()->range().end == config.num_stage_layers(),
              "the stages of " << dir << " end at layer " << parts.back()->range().end << " of "
                               << config.num_stage_layers(),
              "the checkpoint is incomplete: use an earlier copy");
  GPT2 full(config);
  auto params = full->named_parameters();
  std::map<std::string, bool> filled;
  torch::NoGradGuard no_grad;
  for (const auto& part : parts) {
    for (const auto& item : part->named_parameters()) {
      if (filled[item.key()]) continue;  // the head stage's copy of the tied weight
      auto* target = params.find(item.key());
      GPT2P_CHECK(target != nullptr && target->sizes() == item.value().sizes(),
                  dir << ": a stage's parameter '" << item.key() << "' does not fit the model",
                  "the checkpoint is corrupt: use an earlier copy");
      target->copy_(item.value());
      filled[item.key()] = true;
    }
  }
  for (const auto& item : params) {
    GPT2P_CHECK(filled[item.key()], dir << ": no stage holds parameter '" << item.key() << "'",
                "the checkpoint is incomplete: use an earlier copy");
  }
  return full;
}

}  // namespace

ModelDir load_model_dir(const std::string& dir, const LoadOptions& options) {
  ModelDir out;
  const CheckpointKind kind = checkpoint_kind(dir);
  // is_checkpoint_dir also reads meta.json's format: a Hugging Face folder that happens to hold
  // another program's meta.json stays a Hugging Face folder.
  if (kind == CheckpointKind::kReplicated && is_checkpoint_dir(dir)) {
    out.model = load_model(dir, options);
    out.kind = "checkpoint";
    GPT2P_CHECK(out.model->is_full(),
                dir << " holds only layers [" << out.model->range().begin << ", "
                    << out.model->range().end << ") of the model",
                "pass the pipeline checkpoint's root (the folder holding manifest.json and "
                "stage<s>/): its stages are joined");
    out.run_config = read_train_state(dir).config;
  } else if (kind == CheckpointKind::kPipeline) {
    out.model = join_stages(dir, options);
    out.kind = "pipeline checkpoint";
    out.run_config = read_train_state(dir + "/stage0").config;
  } else {
    GPT2P_CHECK(is_hf_dir(dir),
                dir << " is neither a gpt2p checkpoint (meta.json or manifest.json) nor a Hugging "
                    << "Face directory (config.json + model.safetensors)",
                "pass a trainer's checkpoint folder (<out>/checkpoint) or a directory written by "
                "save_pretrained");
    out.model = load_hf(dir);
    out.kind = "Hugging Face";
  }
  return out;
}

std::string recorded_vocab_dir(const ModelDir& model) {
  const auto& c = model.run_config;
  if (!c.is_object() || !c.contains("vocab_dir") || !c["vocab_dir"].is_string()) return "";
  const std::string dir = c["vocab_dir"].get<std::string>();
  return !dir.empty() && fs::is_directory(dir) ? dir : "";
}

}  // namespace gpt2p::model
