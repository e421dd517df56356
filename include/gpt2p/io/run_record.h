// What every training rank records in <out>/rank<r>.h5 (see h5_writer.h for the file rules).
//
//   /steps    one row per optimizer step
//     step, epoch, start, end          seconds since the run started (this rank's clock)
//     data, forward, backward          phase times, seconds (data: the host's time preparing the
//                                      step's batch; dp_train prepares it during the previous
//                                      step, behind that step's GPU work)
//     sync_total, sync_exposed         gradient synchronisation: all of it, and the part not
//                                      hidden behind backward (the time the step waited for it)
//     optimizer                        clipping + optimizer step
//     padded_tokens, target_tokens     this rank's tokens this step: batch*seq as HW5 counts, and
//                                      the target (loss) tokens
//     loss, lr
//     flops, mfu                       this rank's model FLOPs in the step (model/flops.h), and
//                                      flops / step time / the GPU's peak (NaN where unknown)
//     loss_scale, skipped              the loss scale the step ran at (1: no scaling;
//                                      parallel/train/loss_scaler.h) and 1 where it skipped the
//                                      step (its gradients overflowed), else 0. NaN in the rows of
//                                      a file begun by a version without these columns
//   /epochs   one row per epoch
//     epoch, train_time, padded_tokens, tokens_per_sec (padded, HW5), target_tokens_per_sec,
//     val_loss, val_ppl, bleu (NaN where not measured), peak_memory_bytes
//   /actions  pipeline ranks only: one row per executed schedule action
//     step, stage, op, microbatch, start, end, bytes_sent, bytes_recv
//     (op: io::ActionOp, io/action_ops.h; the file's "action_ops" attribute names every code)
//   /segments one row per run that wrote to the file: the first (fresh) run, then every resume
//     steps_row, epochs_row, actions_row   the row of each table at which its rows begin
//     started                              Unix time (seconds) it opened the file; NaN for a first
//                                          segment that predates this table
// Root attributes: program, config (JSON), world_size, rank, host, device, gpu_name, git_commit,
// versions (JSON), started (UTC), action_ops (JSON: op code -> name), peak_memory_bytes (at
// close). A continued file keeps its first
// "started"; the other attributes are those of the latest run.
//
// RecordMode::kAppend (for a run resuming into the same --out) continues an existing rank file
// instead of replacing it: the earlier runs' rows stay, new rows follow, and a /segments row marks
// where this run's begin. Times (start, end) count from each run's own start, and steps a resumed
// run repeats (it went back to its checkpoint) appear once per run: analysis/reader.py keeps the
// latest of each. A file of another program, world size or rank, or with other columns, is not
// continued: the constructor fails with the file, both values and the fix (move the file away).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "gpt2p/io/h5_writer.h"

namespace gpt2p::io {

struct StepRecord {
  long long step = 0;
  long long epoch = 0;
  double start = 0, end = 0;
  double data = 0, forward = 0, backward = 0, sync_total = 0, sync_exposed = 0, optimizer = 0;
  long long padded_tokens = 0, target_tokens = 0;
  double loss = 0, lr = 0;
  double flops = 0, mfu = 0;
  double loss_scale = 1;  // the step's loss scale (1: none)
  long long skipped = 0;  // 1: loss scaling skipped the step (gradients not finite)
};

struct EpochRecord {
  long long epoch = 0;
  double train_time = 0;
  long long padded_tokens = 0;
  double tokens_per_sec = 0, target_tokens_per_sec = 0;
  double val_loss = 0, val_ppl = 0, bleu = 0;
  double peak_memory_bytes = 0;
};

struct ActionRecord {
  long long step = 0;
  int stage = 0, op = 0, microbatch = 0;
  double start = 0, end = 0;
  long long bytes_sent = 0, bytes_recv = 0;
};

struct RunIdentity {
  std::string program, config_json, host, device, gpu_name;
  int world_size = 1, rank = 0;
};

class RunRecorder {
 public:
  // Opens <out_dir>/rank<rank>.h5 (fresh, or continued with kAppend) and writes the identity
  // attributes.
  RunRecorder(const std::string& out_dir, const RunIdentity& id,
              RecordMode mode = RecordMode::kCreate);
  void step(const StepRecord& r);
  void epoch(const EpochRecord& r);
  void action(const ActionRecord& r);
  void set_attribute(const std::string& name, double value) { writer_.set_attribute(name, value); }
  void close() { writer_.close(); }
  const std::string& path() const { return writer_.path(); }

 private:
  void check_identity(const RunIdentity& id) const;
  void add_tables();
  void start_segment();

  H5Writer writer_;
};

}  // namespace gpt2p::io
