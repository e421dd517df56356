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

#include "gpt2p/core/atomic_file.h"
#include "gpt2p/core/error.h"
#include "gpt2p/io/json_input.h"
#include "gpt2p/model/safetensors.h"

namespace gpt2p::model {

namespace fs = std::filesystem;

namespace {
constexpr const char* kFormat = "gpt2p-checkpoint";
constexpr const char* kSetFormat = "gpt2p-checkpoint-set";
constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimizerFile = "optimizer.pt";
constexpr const char* kMetaFile = "meta.json";
constexpr const char* kManifestFile = "manifest.json";
constexpr const char* kCorruptFix = "the checkpoint is corrupt: resume from an earlier copy";

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

std::string from_hex(const std::string& hex, const std::string& where, const std::string& field) {
  auto nibble = [&](char ch) -> int {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    GPT2P_FAIL(where << ": " << field << " contains '" << ch << "', not a hex digit",
               "the checkpoint's meta.json was edited or is corrupt");
  };
  GPT2P_CHECK(hex.size() % 2 == 0, where << ": " << field << " has an odd number of hex digits",
              "the checkpoint's meta.json was edited or is corrupt");
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<char>(nibble(hex[2 * i]) * 16 + nibble(hex[2 * i + 1]));
  }
  return out;
}

// CRC-32 (zlib's) of what passes through, with the byte count.
struct Checksum {
  uint32_t crc = static_cast<uint32_t>(::crc32(0L, Z_NULL, 0));
  uint64_t bytes = 0;

  void add(const void* data, size_t n) {
    const auto* p = static_cast<const Bytef*>(data);
    bytes += n;
    while (n > 0) {
      const auto chunk = static_cast<uInt>(std::min<size_t>(n, size_t{1} << 30));
      crc = static_cast<uint32_t>(::crc32(crc, p, chunk));
      p += chunk;
      n -= chunk;
    }
  }
  std::string hex() const {
    char buf[9];
    std::snprintf(buf, sizeof buf, "%08x", crc);
    return buf;
  }
  nlohmann::json to_json() const { return {{"bytes", bytes}, {"crc32", hex()}}; }
};

// A regular file only: a symbolic link to /dev/zero would otherwise be read until memory ran out.
std::string read_file_bytes(const std::string& path) {
  return io::read_bounded_file(path, "check that the checkpoint is complete and readable",
                               std::numeric_limits<size_t>::max());
}

nlohmann::json read_meta(const std::string& dir) {
  const std::string path = (fs::path(dir) / kMetaFile).string();
  GPT2P_CHECK(fs::exists(path), "checkpoint " << dir << " has no " << kMetaFile,
              "pass a directory written by save_checkpoint (or a Hugging Face directory where "
              "one is accepted)");
  const nlohmann::json meta = io::read_json_file(path, kCorruptFix);
  GPT2P_CHECK(
      meta.is_object() && meta.contains("format") && meta["format"] == kFormat,
      path << " is not a gpt2p checkpoint (format "
           << (meta.is_object() && meta.contains("format") ? meta["format"].dump() : "<none>")
           << ")",
      "pass a directory written by save_checkpoint");
  return meta;
}

// Checks `bytes` (the content of dir/name) against meta.json's "files" entry. Without "files" the
// file cannot be checked: refused, or (allow_unverified) loaded with a warning.
void verify_file(const nlohmann::json& meta, const std::string& dir, const std::string& name,
                 const std::string& bytes, const LoadOptions& options) {
  if (!meta.contains("files")) {
    GPT2P_CHECK(options.allow_unverified,
                "checkpoint " << dir << ": " << kMetaFile << " lists no checksums (\"files\"), so "
                              << name << " cannot be verified",
                "use a checkpoint this version wrote, or pass --allow-unverified-checkpoint to "
                "load it unchecked");
    std::fprintf(stderr,
                 "warning: checkpoint %s: %s lists no checksums; %s is loaded unverified "
                 "(--allow-unverified-checkpoint)\n",
                 dir.c_str(), kMetaFile, name.c_str());
    std::fflush(stderr);
    return;
  }
  const auto& files = meta.at("files");
  const std::string path = (fs::path(dir) / name).string();
  GPT2P_CHECK(files.is_object() && files.contains(name),
              "checkpoint " << dir << ": " << kMetaFile << " lists no checksum for " << name,
              kCorruptFix);
  Checksum found;
  found.add(bytes.data(), bytes.size());
  uint64_t want_bytes = 0;
  std::string want_crc;
  try {
    want_bytes = files.at(name).at("bytes").get<uint64_t>();
    want_crc = files.at(name).at("crc32").get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    GPT2P_FAIL("checkpoint " << dir << ": the " << kMetaFile << " entry for " << name
                             << " is malformed: " << e.what(),
               kCorruptFix);
  }
  GPT2P_CHECK(found.bytes == want_bytes && found.hex() == want_crc,
              path << " does not match " << kMetaFile << ": expected " << want_bytes
                   << " bytes with crc32 " << want_crc << ", found " << found.bytes
                   << " bytes with crc32 " << found.hex(),
              kCorruptFix);
}

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
    case EDQUOT:
      fix = "free disk space or point --out elsewhere";
      break;
    case EROFS:
      fix = (parent.empty() ? std::string(".") : parent) +
            " is on a read-only file system: point --out at a writable directory";
      break;
    case EACCES:
    case EPERM:
      fix = "make " + (parent.empty() ? std::string(".") : parent) +
            " writable for this user or point --out elsewhere";
      break;
    default:
      fix = e.hint();
      break;
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

void verify_checkpoint(const std::string& dir, const LoadOptions& options) {
  const auto meta = read_meta(dir);
  if (!meta.contains("files")) {
    verify_file(meta, dir, kModelFile, "", options);  // refused, or a warning
    return;
  }
  GPT2P_CHECK(meta.at("files").is_object(),
              "checkpoint " << dir << ": \"files\" in " << kMetaFile << " is not an object",
              kCorruptFix);
  for (const auto& [name, entry] : meta.at("files").items()) {
    GPT2P_CHECK(name.find('/') == std::string::npos && name != "." && name != "..",
                "checkpoint " << dir << ": " << kMetaFile << " lists a file '" << name
                              << "' outside the checkpoint",
                kCorruptFix);
    verify_file(meta, dir, name, read_file_bytes((fs::path(dir) / name).string()), options);
  }
}

bool is_checkpoint_dir(const std::string& dir) {
  const fs::path path = fs::path(dir) / kMetaFile;
  if (!fs::is_regular_file(path)) return false;
  try {
    const auto meta = io::read_json_file(path.string(), kCorruptFix);
    return meta.is_object() && meta.contains("format") && meta["format"] == kFormat;
  } catch (const Error&) {
    return false;  // what reads it next says what is wrong with it
  }
}

GPT2Config checkpoint_config(const std::string& dir) {
  const std::string path = (fs::path(dir) / kMetaFile).string();
  const auto meta = read_meta(dir);
  const nlohmann::json j =
      io::json_field(meta, "model_config", io::JsonType::kObject, path, kCorruptFix);
  try {
    return config_from_json(j);
  } catch (const Error& e) {
    GPT2P_FAIL(path << ": \"model_config\": " << e.what_happened(), kCorruptFix);
  }
}

LayerRange checkpoint_range(const std::string& dir) {
  const auto meta = read_meta(dir);
  const std::string path = (fs::path(dir) / kMetaFile).string();
  const GPT2Config config = checkpoint_config(dir);
  const nlohmann::json r =
      io::json_field(meta, "layer_range", io::JsonType::kArray, path, kCorruptFix);
  // Layer 0 is the embedding and n_layer + 1 the final norm and head
  // (GPT2Config::layer_parameters).
  const int64_t last = config.n_layer + 2;
  const bool ok = r.size() == 2 && r[0].is_number_integer() && r[1].is_number_integer() &&
                  r[0].get<int64_t>() >= 0 && r[0].get<int64_t>() < r[1].get<int64_t>() &&
                  r[1].get<int64_t>() <= last;
  GPT2P_CHECK(ok,
              path << ": \"layer_range\" is " << r.dump()
                   << ", not [begin, end] with 0 <= begin < end <= " << last
                   << " (the model_config's n_layer + 2)",
              kCorruptFix);
  return LayerRange{static_cast<int>(r[0].get<int64_t>()), static_cast<int>(r[1].get<int64_t>())};
}

TrainState read_train_state(const std::string& dir) {
  const auto meta = read_meta(dir);
  TrainState s;
  const std::string path = (fs::path(dir) / kMetaFile).string();
  const auto count = [&](const char* key) {
    return io::json_int_field(meta, key, 0, std::numeric_limits<int64_t>::max(), path, kCorruptFix);
  };
  s.step = count("step");
  s.epoch = count("epoch");
  s.batch_in_epoch = count("batch_in_epoch");
  const nlohmann::json seed =
      io::json_field(meta, "seed", io::JsonType::kInteger, path, kCorruptFix);
  GPT2P_CHECK(seed.is_number_unsigned() || seed.get<int64_t>() >= 0,
              path << ": \"seed\" is " << seed.dump() << ", not a seed >= 0", kCorruptFix);
  s.seed = seed.get<uint64_t>();
  s.rng_state = from_hex(io::json_field(meta, "rng_state", io::JsonType::kString, path, kCorruptFix)
                             .get<std::string>(),
                         dir, "rng_state");
  if (meta.contains("rank_rng_states")) {
    const nlohmann::json states =
        io::json_field(meta, "rank_rng_states", io::JsonType::kArray, path, kCorruptFix);
    for (size_t r = 0; r < states.size(); ++r) {
      GPT2P_CHECK(states[r].is_string(),
                  path << ": \"rank_rng_states\"[" << r << "] is " << io::json_type_name(states[r])
                       << ", not a hex string",
                  kCorruptFix);
      s.rank_rng_states.push_back(from_hex(states[r].get<std::string>(), dir,
                                           "rank_rng_states[" + std::to_string(r) + "]"));
    }
  }
  if (meta.contains("config") && !meta["config"].is_null()) {  // null: none was recorded
    s.config = io::json_field(meta, "config", io::JsonType::kObject, path, kCorruptFix);
  }
  return s;
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

void write_checkpoint_manifest(const std::string& dir, const nlohmann::json& manifest) {
  GPT2P_CHECK(manifest.is_object(),
              "the manifest of checkpoint " << dir << " must be a JSON object, not "
                                            << manifest.type_name(),
              "pass an object, e.g. {\"stages\": [...]}");
  nlohmann::json out = manifest;
  out["format"] = kSetFormat;
  write_bytes_atomically((fs::path(dir) / kManifestFile).string(), out.dump(2) + "\n");
}

nlohmann::json read_checkpoint_manifest(const std::string& dir) {
  const std::string path = (fs::path(dir) / kManifestFile).string();
  GPT2P_CHECK(fs::exists(path),
              dir << " is not a committed checkpoint (no " << kManifestFile
                  << "): it was interrupted while being written",
              "resume from the previous one");
  const nlohmann::json manifest = io::read_json_file(path, kCorruptFix);
  GPT2P_CHECK(
      manifest.is_object() && manifest.contains("format") && manifest["format"] == kSetFormat,
      path << " is not a gpt2p checkpoint manifest (format "
           << (manifest.is_object() && manifest.contains("format") ? manifest["format"].dump()
                                                                   : "<none>")
           << ")",
      "pass the root directory of a multi-part checkpoint");
  return manifest;
}

}  // namespace gpt2p::model
