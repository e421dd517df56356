// A whole model named by one directory, for the programs that use a trained model (gpt2_eval,
// gpt2_generate). The directory is one of
//   * a checkpoint of the full model (dp_train, gpt2_train: meta.json),
//   * a pipeline checkpoint (pp_train: manifest.json, stage<s>/ per stage), its stages joined
//     into one model (the embedding stage's copy of the tied weight is the one kept),
//   * a Hugging Face GPT-2 directory (config.json + model.safetensors).
// Every file is checked as checkpoint.h and hf_checkpoint.h check them; errors name the
// directory, what is wrong and what to pass instead.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "gpt2p/model/checkpoint.h"
#include "gpt2p/model/gpt2.h"

namespace gpt2p::model {

struct ModelDir {
  GPT2 model{nullptr};
  std::string kind;           // "checkpoint", "pipeline checkpoint" or "Hugging Face"
  nlohmann::json run_config;  // the training run's configuration (checkpoints), else null
};

ModelDir load_model_dir(const std::string& dir, const LoadOptions& options = {});

// The vocabulary directory the model's training run recorded (its config's "vocab_dir"), when
// that directory exists here; else "".
std::string recorded_vocab_dir(const ModelDir& model);

}  // namespace gpt2p::model
