#include "gpt2p/io/run_record.h"

#include "gpt2p/io/run_info.h"

namespace gpt2p::io {

RunRecorder::RunRecorder(const std::string& out_dir, const RunIdentity& id)
    : writer_(out_dir + "/rank" + std::to_string(id.rank) + ".h5") {
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
  writer_.set_attribute("started", utc_timestamp());
  writer_.add_table("steps", {"step", "epoch", "start", "end", "data", "forward", "backward",
                              "sync_total", "sync_exposed", "optimizer", "padded_tokens",
                              "target_tokens", "loss", "lr"});
  writer_.add_table("epochs", {"epoch", "train_time", "padded_tokens", "tokens_per_sec",
                               "target_tokens_per_sec", "val_loss", "val_ppl", "bleu",
                               "peak_memory_bytes"});
  writer_.add_table("actions", {"step", "stage", "op", "microbatch", "start", "end", "bytes_sent",
                                "bytes_recv"});
}

void RunRecorder::step(const StepRecord& r) {
  writer_.append("steps", {static_cast<double>(r.step), static_cast<double>(r.epoch), r.start,
                           r.end, r.data, r.forward, r.backward, r.sync_total, r.sync_exposed,
                           r.optimizer, static_cast<double>(r.padded_tokens),
                           static_cast<double>(r.target_tokens), r.loss, r.lr});
}

void RunRecorder::epoch(const EpochRecord& r) {
  writer_.append("epochs", {static_cast<double>(r.epoch), r.train_time,
                            static_cast<double>(r.padded_tokens), r.tokens_per_sec,
                            r.target_tokens_per_sec, r.val_loss, r.val_ppl, r.bleu,
                            r.peak_memory_bytes});
}

void RunRecorder::action(const ActionRecord& r) {
  writer_.append("actions", {static_cast<double>(r.step), static_cast<double>(r.stage),
                             static_cast<double>(r.op), static_cast<double>(r.microbatch), r.start,
                             r.end, static_cast<double>(r.bytes_sent),
                             static_cast<double>(r.bytes_recv)},
                 /*flush=*/false);  // flushed with the step's row
}

}  // namespace gpt2p::io
