// Our training checkpoints: a directory written atomically with
//   model.safetensors  the model's parameters under their GPT2 names (a stage writes its own)
//   optimizer.pt       torch::optim::Optimizer::save (absent when no optimizer was given)
//   meta.json          {"format": "gpt2p-checkpoint", "model_config": ..., "layer_range": [b, e],
//                       "step", "epoch", "batch_in_epoch", "seed", "rng_state" (hex), "config"}
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "gpt2p/model/gpt2.h"

namespace gpt2p::model {

// Where training stands, enough to resume exactly.
struct TrainState {
  int64_t step = 0;
  int64_t epoch = 0;
  int64_t batch_in_epoch = 0;
  uint64_t seed = 0;
  std::string rng_state;  // bytes of torch's CPU generator state (compat::cpu_rng_state)
  nlohmann::json config;  // the run's configuration, free-form
};

// optimizer may be null (only the model is saved).
void save_checkpoint(const std::string& dir, const GPT2Impl& model,
                     const torch::optim::Optimizer* optimizer, const TrainState& state);

// Loads parameters (and the optimizer state if optimizer is non-null) into existing objects and
// returns the saved TrainState. Errors name the checkpoint, the parameter, both shapes and a fix.
// Restoring torch's RNG from TrainState::rng_state is left to the caller.
TrainState load_checkpoint(const std::string& dir, GPT2Impl& model,
                           torch::optim::Optimizer* optimizer);

// True when dir holds meta.json with our format tag.
bool is_checkpoint_dir(const std::string& dir);

// meta.json alone: the model config and layer range a checkpoint was written from, and its state.
GPT2Config checkpoint_config(const std::string& dir);
LayerRange checkpoint_range(const std::string& dir);
TrainState read_train_state(const std::string& dir);

// A model built from the checkpoint's config and range, with its parameters loaded.
GPT2 load_model(const std::string& dir);

}  // namespace gpt2p::model
