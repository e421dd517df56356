// Our training checkpoints: a directory written atomically with
//   model.safetensors  the model's parameters under their GPT2 names (a stage writes its own)
//   optimizer.pt       torch::optim::Optimizer::save (absent when no optimizer was given)
//   meta.json          {"format": "gpt2p-checkpoint", "model_config": ..., "layer_range": [b, e],
//                       "step", "epoch", "batch_in_epoch", "seed", "rng_state" (hex),
//                       "rank_rng_states": [hex, ...], "config",
//                       "files": {"model.safetensors": {"bytes": N, "crc32": "8 hex digits"},
//                                 "optimizer.pt": {...}}}
// Every file is written with checked writes and fsynced before the directory is renamed into
// place: a full disk or a read-only directory is a gpt2p::Error and the previous checkpoint stays.
// Loading checks each file's size and CRC-32 against meta.json before using it (checkpoints
// without "files", from older versions, load unchecked).
//
// A multi-part checkpoint (one checkpoint directory per pipeline stage below one root) is
// committed by write_checkpoint_manifest, written after every part: a root without manifest.json
// was interrupted while being written.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gpt2p/model/checkpoint_kind.h"
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
  // Opaque generator states, one per data-parallel rank (rank r's at index r); empty when the
  // checkpoint has none (older checkpoints).
  std::vector<std::string> rank_rng_states{};
  // Dynamic loss scaling (parallel/train/loss_scaler.h): the scale, 0 when the run does not scale
  // (then meta.json has no "loss_scale"); the finite steps since it last changed; the steps
  // skipped.
  double loss_scale = 0;
  int64_t loss_scale_good_steps = 0;
  int64_t skipped_steps = 0;
};

// A parameter larger than this in magnitude means the run has diverged (GPT-2's weights are of
// order 1; a run at --lr 1e30 reaches 1e30): save_checkpoint refuses it and keeps the last good
// one.
inline constexpr double kDivergedMagnitude = 1e4;

// How a checkpoint is read. A meta.json without checksums ("files") is refused unless
// allow_unverified (--allow-unverified-checkpoint), which then prints a warning per file.
struct LoadOptions {
  bool allow_unverified = false;
};

// optimizer may be null (only the model is saved). Refuses (gpt2p::Error, dir untouched) when a
// parameter or an optimizer state tensor is not finite, or a parameter exceeds kDivergedMagnitude;
// a failed write (full disk, read-only or unwritable directory) is a gpt2p::Error naming the file,
// and the previous dir is kept.
void save_checkpoint(const std::string& dir, const GPT2Impl& model,
                     const torch::optim::Optimizer* optimizer, const TrainState& state);

// Loads parameters (and the optimizer state if optimizer is non-null) into existing objects and
// returns the saved TrainState. Errors name the checkpoint, the parameter, both shapes and a fix;
// a file whose size or CRC-32 differs from meta.json, or an unreadable optimizer.pt, is an error
// naming the file. Restoring torch's RNG from TrainState::rng_state is left to the caller.
TrainState load_checkpoint(const std::string& dir, GPT2Impl& model,
                           torch::optim::Optimizer* optimizer, const LoadOptions& options = {});

// Checks the size and CRC-32 of every file meta.json lists (refused without checksums, as above).
void verify_checkpoint(const std::string& dir, const LoadOptions& options = {});

// True when dir holds meta.json with our format tag.
bool is_checkpoint_dir(const std::string& dir);

// meta.json alone: the model config and layer range a checkpoint was written from, and its state.
GPT2Config checkpoint_config(const std::string& dir);
LayerRange checkpoint_range(const std::string& dir);
// read_train_state refuses a negative step, epoch or batch and fields of the wrong type.
TrainState read_train_state(const std::string& dir);

// A model built from the checkpoint's config and range, with its parameters loaded.
GPT2 load_model(const std::string& dir, const LoadOptions& options = {});

// manifest.json at the root of a multi-part checkpoint: `manifest` (a JSON object, free-form)
// with "format": "gpt2p-checkpoint-set" added, written atomically and fsynced. Write it last:
// it marks the root as complete.
void write_checkpoint_manifest(const std::string& dir, const nlohmann::json& manifest);

// The manifest written by write_checkpoint_manifest (with its "format"). A root without one is an
// error saying it was interrupted while being written.
nlohmann::json read_checkpoint_manifest(const std::string& dir);

}  // namespace gpt2p::model
