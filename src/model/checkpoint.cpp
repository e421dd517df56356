#include "gpt2p/model/checkpoint.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
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

std::string read_file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  GPT2P_CHECK(in.good(), "cannot open " << path << ": " << std::strerror(errno),
              "check that the checkpoint is complete and readable");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  GPT2P_CHECK(!in.bad(), "reading " << path << " failed: " << std::strerror(errno),
              "check the disk and that the file is readable");
  return bytes;
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
    GPT2P_FAIL(path << " is not valid JSON: " << e.what(), kCorruptFix);
  }
  GPT2P_CHECK(
      meta.is_object() && meta.value("format", "") == kFormat,
      path << " is not a gpt2p checkpoint (format "
           << (meta.is_object() ? meta.value("format", "<none>") : "<none>") << ")",
      "pass a directory written by save_checkpoint");
  return meta;
}

// Checks `bytes` (the content of dir/name) against meta.json's "files" entry; nothing to check
// when meta.json has no "files" (older checkpoints).
void verify_file(const nlohmann::json& meta, const std::string& dir, const std::string& name,
                 const std::string& bytes) {
  if (!meta.contains("files")) return;
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

// Throws when a parameter or an optimizer state tensor holds NaN or Inf.
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
      GPT2P_CHECK(finite(t),
                  "not saving: the optimizer state is not finite at step "
                      << step << " (" << kept << ")",
                  fix);
    }
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
                           torch::optim::Optimizer* optimizer) {
  const TrainState state = read_train_state(dir);
  const auto meta = read_meta(dir);
  const std::string model_path = (fs::path(dir) / kModelFile).string();
  SafeTensors file;
  {
    const std::string bytes = read_file_bytes(model_path);
    verify_file(meta, dir, kModelFile, bytes);
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
    verify_file(meta, dir, kOptimizerFile, bytes);
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
      GPT2P_FAIL("the optimizer state " << path << " does not fit this optimizer: "
                                        << torch_message(e),
                 "resume with the optimizer and model the checkpoint was written with, or "
                 "resume from an earlier copy if it is corrupt");
    }
  }
  return state;
}

void verify_checkpoint(const std::string& dir) {
  const auto meta = read_meta(dir);
  if (!meta.contains("files")) return;
  GPT2P_CHECK(meta.at("files").is_object(),
              "checkpoint " << dir << ": \"files\" in " << kMetaFile << " is not an object",
              kCorruptFix);
  for (const auto& [name, entry] : meta.at("files").items()) {
    GPT2P_CHECK(name.find('/') == std::string::npos && name != "." && name != "..",
                "checkpoint " << dir << ": " << kMetaFile << " lists a file '" << name
                              << "' outside the checkpoint",
                kCorruptFix);
    verify_file(meta, dir, name, read_file_bytes((fs::path(dir) / name).string()));
  }
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
  return LayerRange{r.at(0).get<int>(), r.at(1).get<int>()};
}

TrainState read_train_state(const std::string& dir) {
  const auto meta = read_meta(dir);
  TrainState s;
  try {
    s.step = meta.at("step").get<int64_t>();
    s.epoch = meta.at("epoch").get<int64_t>();
    s.batch_in_epoch = meta.at("batch_in_epoch").get<int64_t>();
    s.seed = meta.at("seed").get<uint64_t>();
    s.rng_state = from_hex(meta.at("rng_state").get<std::string>(), dir, "rng_state");
    if (meta.contains("rank_rng_states")) {
      const auto& states = meta.at("rank_rng_states");
      for (size_t r = 0; r < states.size(); ++r) {
        s.rank_rng_states.push_back(from_hex(states.at(r).get<std::string>(), dir,
                                             "rank_rng_states[" + std::to_string(r) + "]"));
      }
    }
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
  std::ifstream in(path);
  GPT2P_CHECK(in.good(),
              dir << " is not a committed checkpoint (no " << kManifestFile
                  << "): it was interrupted while being written",
              "resume from the previous one");
  nlohmann::json manifest;
  try {
    manifest = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    GPT2P_FAIL(path << " is not valid JSON: " << e.what(), kCorruptFix);
  }
  GPT2P_CHECK(manifest.is_object() && manifest.value("format", "") == kSetFormat,
              path << " is not a gpt2p checkpoint manifest (format "
                   << (manifest.is_object() ? manifest.value("format", "<none>") : "<none>")
                   << ")",
              "pass the root directory of a multi-part checkpoint");
  return manifest;
}

}  // namespace gpt2p::model
