#include "gpt2p/model/checkpoint.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <limits>
#include <set>

#include "checkpoint_files.h"
#include "gpt2p/core/atomic_file.h"
#include "gpt2p/core/error.h"
#include "gpt2p/io/json_input.h"
#include "gpt2p/model/safetensors.h"

namespace gpt2p::model {

namespace fs = std::filesystem;
using namespace checkpoint_files;  // NOLINT(google-build-using-namespace)

namespace {
// The first line of an exception from torch, without its C++ backtrace.
std::string torch_message(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  std::string msg = c10_error != nullptr ? c10_error->what_without_backtrace() : e.what();
  const auto nl = msg.find('\n');
  return nl == std::string::npos ? msg : msg.substr(0, nl);
}

// Throws when a parameter or an optimizer state tensor holds NaN or Inf, or a parameter has grown
// past kDivergedMagnitude: a diverged run, whose checkpoint must not replace the last good one.
void check_finite(const std::string& dir, const GPT2Impl& model,
                  const torch::optim::Optimizer* optimizer, int64_t step) {
  const std::string kept = fs::exists(dir) ? "the last good checkpoint in " + dir + " is kept"
                                           : "nothing was written to " + dir;
  const char* fix = "lower --lr or use --precision fp32";
  torch::NoGradGuard no_grad;
  const auto finite = [](const torch::Tensor& t) {
    return !t.defined() || t.numel() == 0 || !t.is_floating_point() ||
           torch::isfinite(t).all().item<bool>();
  };
  for (const auto& item : model.named_parameters()) {
    GPT2P_CHECK(finite(item.value()),
                "not saving: parameters are not finite at step "
                    << step << " ('" << item.key() << "' holds NaN or Inf; " << kept << ")",
                fix);
    const auto& t = item.value();
    if (!t.defined() || t.numel() == 0 || !t.is_floating_point()) continue;
    const double largest = t.detach().abs().max().item<double>();
    GPT2P_CHECK(largest <= kDivergedMagnitude,
                "not saving: the run has diverged by step "
                    << step << " ('" << item.key() << "' holds a value of magnitude " << largest
                    << ", over " << kDivergedMagnitude << "; " << kept << ")",
                fix);
  }
  if (optimizer == nullptr) return;
  for (const auto& entry : optimizer->state()) {
    std::vector<torch::Tensor> tensors;
    const auto* st = entry.second.get();
    if (const auto* s = dynamic_cast<const torch::optim::AdamWParamState*>(st)) {
      tensors = {s->exp_avg(), s->exp_avg_sq(), s->max_exp_avg_sq()};
    } else if (const auto* s = dynamic_cast<const torch::optim::AdamParamState*>(st)) {
      tensors = {s->exp_avg(), s->exp_avg_sq(), s->max_exp_avg_sq()};
    } else if (const auto* s = dynamic_cast<const torch::optim::SGDParamState*>(st)) {
      tensors = {s->momentum_buffer()};
    }
    for (const auto& t : tensors) {
      GPT2P_CHECK(
          finite(t),
          "not saving: the optimizer state is not finite at step " << step << " (" << kept << ")",
          fix);
    }
  }
}

// Every parameter of the model, checked right after a load: `path` is the file it came from.
void check_loaded_finite(const GPT2Impl& model, const std::string& path) {
  torch::NoGradGuard no_grad;
  for (const auto& item : model.named_parameters()) {
    const auto& t = item.value();
    if (!t.defined() || t.numel() == 0 || !t.is_floating_point()) continue;
    GPT2P_CHECK(torch::isfinite(t).all().item<bool>(),
                path << ": parameter '" << item.key() << "' holds NaN or Inf",
                "the file was written by a run that had diverged or was damaged; load an "
                "earlier checkpoint");
  }
}

// A failed write during save_checkpoint, with the fix for a training run and what was kept.
[[noreturn]] void rethrow_save_error(const FileError& e, const std::string& dir,
                                     bool had_previous) {
  const std::string kept = had_previous ? "the previous checkpoint " + dir + " is kept"
                                        : "no checkpoint was written to " + dir;
  const std::string parent = fs::path(dir).parent_path().string();
  std::string fix;
  switch (e.error_number()) {
    case ENOSPC:
    case EDQUOT: fix = "free disk space or point --out elsewhere"; break;
    case EROFS:
      fix = (parent.empty() ? std::string(".") : parent) +
            " is on a read-only file system: point --out at a writable directory";
      break;
    case EACCES:
    case EPERM:
      fix = "make " + (parent.empty() ? std::string(".") : parent) +
            " writable for this user or point --out elsewhere";
      break;
    default: fix = e.hint(); break;
  }
  throw FileError(e.error_number(), e.what_happened(), fix + "; " + kept, __FILE__, __LINE__);
}

// The optimizer's archive streamed to `out` (with its checksum). The stream writer's own error
// path throws from a destructor (std::terminate), so the sink never reports a short write to it:
// the first failure is kept and rethrown once the archive is complete.
void write_optimizer(FileWriter& out, Checksum& sum, const torch::optim::Optimizer& optimizer) {
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  std::exception_ptr failure;
  try {
    archive.save_to([&](const void* data, size_t n) -> size_t {
      if (failure) return n;
      try {
        out.write(data, n);
        sum.add(data, n);
      } catch (...) {
        failure = std::current_exception();
      }
      return n;
    });
  } catch (const c10::Error& e) {
    if (failure) std::rethrow_exception(failure);
    GPT2P_FAIL("cannot serialise the optimizer state to " << out.path() << ": " << torch_message(e),
               "this is a bug in the optimizer's state; save without the optimizer to keep the "
               "weights");
  }
  if (failure) std::rethrow_exception(failure);
}
}  // namespace

void save_checkpoint(const std::string& dir, const GPT2Impl& model,
                     const torch::optim::Optimizer* optimizer, const TrainState& state) {
  check_finite(dir, model, optimizer, state.step);
  std::map<std::string, torch::Tensor> params;
  for (const auto& item : model.named_parameters()) params.emplace(item.key(), item.value());
  nlohmann::json rank_rng = nlohmann::json::array();
  for (const auto& s : state.rank_rng_states) rank_rng.push_back(to_hex(s));
  nlohmann::json meta = {{"format", kFormat},
                         {"model_config", to_json(model.config())},
                         {"layer_range", {model.range().begin, model.range().end}},
                         {"step", state.step},
                         {"epoch", state.epoch},
                         {"batch_in_epoch", state.batch_in_epoch},
                         {"seed", state.seed},
                         {"rng_state", to_hex(state.rng_state)},
                         {"rank_rng_states", rank_rng},
                         {"config", state.config}};
  if (state.loss_scale > 0) {
    meta["loss_scale"] = {{"scale", state.loss_scale},
                          {"good_steps", state.loss_scale_good_steps},
                          {"skipped_steps", state.skipped_steps}};
  }
  const bool had_previous = fs::exists(dir);
  try {
    write_dir_atomically(dir, [&](const std::string& tmp) {
      nlohmann::json files = nlohmann::json::object();
      {
        FileWriter out((fs::path(tmp) / kModelFile).string());
        Checksum sum;
        stream_safetensors(
            [&](const void* data, size_t n) {
              out.write(data, n);
              sum.add(data, n);
            },
            params);
        out.close();
        files[kModelFile] = sum.to_json();
      }
      if (optimizer != nullptr) {
        FileWriter out((fs::path(tmp) / kOptimizerFile).string());
        Checksum sum;
        write_optimizer(out, sum, *optimizer);
        out.close();
        files[kOptimizerFile] = sum.to_json();
      }
      meta["files"] = files;
      FileWriter out((fs::path(tmp) / kMetaFile).string());
      out.write(meta.dump(2) + "\n");
      out.close();
    });
  } catch (const FileError& e) {
    rethrow_save_error(e, dir, had_previous);
  }
}

TrainState load_checkpoint(const std::string& dir, GPT2Impl& model,
                           torch::optim::Optimizer* optimizer, const LoadOptions& options) {
  const TrainState state = read_train_state(dir);
  const auto meta = read_meta(dir);
  const std::string model_path = (fs::path(dir) / kModelFile).string();
  SafeTensors file;
  {
    const std::string bytes = read_file_bytes(model_path);
    verify_file(meta, dir, kModelFile, bytes, options);
    file = parse_safetensors(bytes.data(), bytes.size(), model_path);
  }
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
  check_loaded_finite(model, model_path);
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
    const std::string bytes = read_file_bytes(path);
    verify_file(meta, dir, kOptimizerFile, bytes, options);
    torch::serialize::InputArchive archive;
    try {
      archive.load_from(bytes.data(), bytes.size());
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      GPT2P_FAIL("cannot read the optimizer state " << path << ": " << torch_message(e),
                 kCorruptFix);
    }
    try {
      optimizer->load(archive);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      GPT2P_FAIL(
          "the optimizer state " << path << " does not fit this optimizer: " << torch_message(e),
          "resume with the optimizer and model the checkpoint was written with, or "
          "resume from an earlier copy if it is corrupt");
    }
  }
  return state;
}

GPT2 load_model(const std::string& dir, const LoadOptions& options) {
  const GPT2Config config = checkpoint_config(dir);
  const LayerRange range = checkpoint_range(dir);
  const fs::path weights = fs::path(dir) / kModelFile;
  GPT2P_CHECK(fs::is_regular_file(weights),
              "checkpoint " << dir << " has no " << kModelFile << " (a regular file)", kCorruptFix);
  check_config_fits_weights(config, range.begin, range.end, config.padded_vocab_size(),
                            fs::file_size(weights), (fs::path(dir) / kMetaFile).string(),
                            weights.string());
  GPT2 model(config, range);
  load_checkpoint(dir, *model, nullptr, options);
  return model;
}

}  // namespace gpt2p::model
