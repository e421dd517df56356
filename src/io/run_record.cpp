#include "gpt2p/io/run_record.h"

#include <chrono>
#include <limits>
#include <utility>

#include "gpt2p/core/error.h"
#include "gpt2p/core/process_info.h"
#include "gpt2p/io/action_ops.h"
#include "gpt2p/io/run_info.h"

namespace gpt2p::io {

RunRecorder::RunRecorder(const std::string& out_dir, const RunIdentity& id, RecordMode mode)
    : writer_(out_dir + "/rank" + std::to_string(id.rank) + ".h5", mode) {
  try {
    if (writer_.continued()) check_identity(id);
    add_tables();
  } catch (...) {
    writer_.put_back();  // a file that is not continued stays as it was found
    throw;
  }
  writer_.set_attribute("program", id.program);
  writer_.set_attribute("config", id.config_json);
  writer_.set_attribute("world_size", static_cast<long long>(id.world_size));
  writer_.set_attribute("rank", static_cast<long long>(id.rank));
  writer_.set_attribute("host", id.host);
  writer_.set_attribute("device", id.device);
  writer_.set_attribute("gpu_name", id.gpu_name);
  const auto versions = library_versions();
  writer_.set_attribute("git_commit", versions["git_commit"].get<std::string>());
  writer_.set_attribute("versions", versions.dump());
  writer_.set_attribute("action_ops", action_ops_json());
  if (!writer_.continued() || !writer_.attribute("started")) {
    writer_.set_attribute("started", utc_timestamp());
  }
  start_segment();
}

void RunRecorder::add_tables() {
  writer_.add_table("steps",
                    {"step", "epoch", "start", "end", "data", "forward", "backward", "sync_total",
                     "sync_exposed", "optimizer", "padded_tokens", "target_tokens", "loss", "lr",
                     "flops", "mfu", "loss_scale", "skipped"});
  writer_.add_table(
      "epochs", {"epoch", "train_time", "padded_tokens", "tokens_per_sec", "target_tokens_per_sec",
                 "val_loss", "val_ppl", "bleu", "peak_memory_bytes"});
  writer_.add_table(
      "actions", {"step", "stage", "op", "microbatch", "start", "end", "bytes_sent", "bytes_recv"});
  writer_.add_table("segments", {"steps_row", "epochs_row", "actions_row", "started"});
}

// A continued file must be this rank's file of a run of the same shape.
void RunRecorder::check_identity(const RunIdentity& id) const {
  const std::pair<const char*, std::string> fields[] = {
      {"program", id.program},
      {"world_size", std::to_string(id.world_size)},
      {"rank", std::to_string(id.rank)}};
  for (const auto& [name, ours] : fields) {
    const std::string theirs = writer_.attribute(name).value_or("(none)");
    GPT2P_CHECK(theirs == ours,
                "cannot continue timing file " << writer_.path() << ": it records " << name << " "
                                               << theirs << ", this run has " << ours,
                "the file is another run's: move it out of --out (or use a new --out), then run "
                "again");
  }
}

void RunRecorder::start_segment() {
  if (writer_.continued() && writer_.rows("segments") == 0) {
    writer_.append("segments", {0, 0, 0, std::numeric_limits<double>::quiet_NaN()});
  }
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  writer_.append("segments", {static_cast<double>(writer_.rows("steps")),
                              static_cast<double>(writer_.rows("epochs")),
                              static_cast<double>(writer_.rows("actions")), now});
}

void RunRecorder::step(const StepRecord& r) {
  writer_.append(
      "steps", {static_cast<double>(r.step), static_cast<double>(r.epoch), r.start, r.end, r.data,
                r.forward, r.backward, r.sync_total, r.sync_exposed, r.optimizer,
                static_cast<double>(r.padded_tokens), static_cast<double>(r.target_tokens), r.loss,
                r.lr, r.flops, r.mfu, r.loss_scale, static_cast<double>(r.skipped)});
}

void RunRecorder::epoch(const EpochRecord& r) {
  writer_.append("epochs",
                 {static_cast<double>(r.epoch), r.train_time, static_cast<double>(r.padded_tokens),
                  r.tokens_per_sec, r.target_tokens_per_sec, r.val_loss, r.val_ppl, r.bleu,
                  r.peak_memory_bytes});
}

void RunRecorder::action(const ActionRecord& r) {
  writer_.append("actions",
                 {static_cast<double>(r.step), static_cast<double>(r.stage),
                  static_cast<double>(r.op), static_cast<double>(r.microbatch), r.start, r.end,
                  static_cast<double>(r.bytes_sent), static_cast<double>(r.bytes_recv)},
                 /*flush=*/false);  // flushed with the step's row
}

}  // namespace gpt2p::io
