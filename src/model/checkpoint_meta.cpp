// meta.json and manifest.json: what a checkpoint records besides its tensors, and the checks of
// everything read from them (types, ranges, checksums), so that a damaged or edited file is one
// line naming the file and the field.
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <limits>

#include "checkpoint_files.h"
#include "gpt2p/core/atomic_file.h"
#include "gpt2p/core/error.h"
#include "gpt2p/io/json_input.h"

namespace gpt2p::model {

namespace fs = std::filesystem;

namespace checkpoint_files {

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

Checksum::Checksum() : crc(static_cast<uint32_t>(::crc32(0L, Z_NULL, 0))) {}

void Checksum::add(const void* data, size_t n) {
  const auto* p = static_cast<const Bytef*>(data);
  bytes += n;
  while (n > 0) {
    const auto chunk = static_cast<uInt>(std::min<size_t>(n, size_t{1} << 30));
    crc = static_cast<uint32_t>(::crc32(crc, p, chunk));
    p += chunk;
    n -= chunk;
  }
}

std::string Checksum::hex() const {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", crc);
  return buf;
}

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
  const std::string meta_path = (fs::path(dir) / kMetaFile).string();
  const std::string entry_name = meta_path + ": \"files\"";
  const nlohmann::json entry =
      io::json_field(files, name, io::JsonType::kObject, entry_name, kCorruptFix);
  const std::string where = entry_name + "[\"" + name + "\"]";
  const auto want_bytes = static_cast<uint64_t>(io::json_int_field(
      entry, "bytes", 0, std::numeric_limits<int64_t>::max(), where, kCorruptFix));
  const std::string want_crc =
      io::json_field(entry, "crc32", io::JsonType::kString, where, kCorruptFix).get<std::string>();
  GPT2P_CHECK(found.bytes == want_bytes && found.hex() == want_crc,
              path << " does not match " << kMetaFile << ": expected " << want_bytes
                   << " bytes with crc32 " << want_crc << ", found " << found.bytes
                   << " bytes with crc32 " << found.hex(),
              kCorruptFix);
}

}  // namespace checkpoint_files

using namespace checkpoint_files;  // NOLINT(google-build-using-namespace): this file's own names

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

CheckpointKind checkpoint_kind(const std::string& dir) {
  std::error_code ec;  // a folder that cannot be looked into holds neither
  if (fs::is_regular_file(fs::path(dir) / kMetaFile, ec)) return CheckpointKind::kReplicated;
  if (fs::is_regular_file(fs::path(dir) / kManifestFile, ec)) return CheckpointKind::kPipeline;
  return CheckpointKind::kNone;
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

namespace {
// meta.json's "model_config", from meta.json already read (`path` names it in errors).
GPT2Config config_from_meta(const nlohmann::json& meta, const std::string& path) {
  const nlohmann::json j =
      io::json_field(meta, "model_config", io::JsonType::kObject, path, kCorruptFix);
  try {
    return config_from_json(j);
  } catch (const Error& e) {
    GPT2P_FAIL(path << ": \"model_config\": " << e.what_happened(), kCorruptFix);
  }
}
}  // namespace

GPT2Config checkpoint_config(const std::string& dir) {
  return config_from_meta(read_meta(dir), (fs::path(dir) / kMetaFile).string());
}

LayerRange checkpoint_range(const std::string& dir) {
  const auto meta = read_meta(dir);
  const std::string path = (fs::path(dir) / kMetaFile).string();
  const GPT2Config config = config_from_meta(meta, path);
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
  if (meta.contains("loss_scale")) {
    const nlohmann::json ls =
        io::json_field(meta, "loss_scale", io::JsonType::kObject, path, kCorruptFix);
    const std::string where = path + ": \"loss_scale\"";
    s.loss_scale =
        io::json_field(ls, "scale", io::JsonType::kNumber, where, kCorruptFix).get<double>();
    // The range --loss-scale-init takes (parallel/loss_scaler.h).
    GPT2P_CHECK(s.loss_scale >= 1.0 / 1024 && s.loss_scale <= 16777216.0,
                where << ": \"scale\" is " << s.loss_scale << ", not in [2^-10, 2^24]",
                kCorruptFix);
    s.loss_scale_good_steps = io::json_int_field(
        ls, "good_steps", 0, std::numeric_limits<int64_t>::max(), where, kCorruptFix);
    s.skipped_steps = io::json_int_field(ls, "skipped_steps", 0,
                                         std::numeric_limits<int64_t>::max(), where, kCorruptFix);
  }
  if (meta.contains("config") && !meta["config"].is_null()) {  // null: none was recorded
    s.config = io::json_field(meta, "config", io::JsonType::kObject, path, kCorruptFix);
  }
  return s;
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
