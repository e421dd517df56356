// Pieces of the training loop (train/loop.h) and its step strategies (trainers/dp_trainer.cpp for
// data parallelism, trainers/pp_trainer.cpp for pipelines): clocks, batches on the device, progress
// lines, step bookkeeping.
#pragma once

#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "gpt2p/comm/communicator.h"
#include "gpt2p/data/batch.h"
#include "gpt2p/io/run_record.h"
#include "gpt2p/model/checkpoint.h"
#include "gpt2p/parallel/train/data.h"
#include "gpt2p/parallel/train/options.h"

namespace gpt2p::parallel {

using Clock = std::chrono::steady_clock;

// Seconds from t0 to now (host clock).
double since(Clock::time_point t0);

struct DeviceBatch {
  torch::Tensor inputs, labels, mask;  // [B, T]: int64, int64, float32
};
// Copies a host batch to `device` (pinned, non-blocking on CUDA).
DeviceBatch to_device(const data::Batch& b, const torch::Device& device);
// The batch's loss mask as a [B, T] float32 CPU tensor viewing b's memory (no copy).
torch::Tensor host_mask(const data::Batch& b);

// "1h02m03s".
std::string format_eta(double seconds);

// Rank 0's progress line: "epoch E/N step B/P loss L[ scaling] | 52.1 ms/step lr 0.0001 | tok/s X
// (all ranks)[ mfu M%] | eta ...". tok/s is this step's tokens of all ranks (padded, the batch
// once) over its time, as the analysis counts them; `scaling` (e.g. " scale 32768 (2 skipped)")
// follows the loss.
void print_progress(int64_t epoch, int epochs, int64_t batch, int64_t per_epoch, double loss,
                    double step_seconds, double lr, double tokens_per_sec, double mfu,
                    double eta_seconds, const std::string& scaling = "");

// HW5's per-rank line: "Epoch {e} on Rank {r}: Training Time = {t}, Tokens_per_sec = {x}" (HW5's
// format: epochs from 0, one rank's tokens over its epoch's training time), then a label that says
// so.
void print_epoch_time(int64_t epoch, int rank, double train_time, int64_t tokens);

// One epoch's totals of this rank's steps.
struct EpochTotals {
  double time = 0;               // seconds in timed steps (evaluation and checkpoints excluded)
  int64_t tokens = 0;            // padded tokens, as HW5 counts them
  int64_t targets = 0;           // target (loss) tokens
  double peak_memory_bytes = 0;  // the device's peak over the epoch's steps (end_epoch)
};

// Where a step sits, for the progress line.
struct StepPlace {
  int64_t epoch = 0;
  int epochs = 0;
  int64_t batch = 0;
  int64_t per_epoch = 0;
  int log_every = 1;
  bool prints = false;         // rank 0 only
  double tokens_factor = 1.0;  // step tokens x this = tokens of all ranks
  // MFU (model/flops.h): one GPU's peak FLOP/s (0: unknown, no MFU), the model FLOPs of the
  // whole step over all ranks, and the ranks sharing it.
  double peak_flops = 0;
  double run_flops = 0;
  int ranks = 1;
  // Loss scaling (loss_scaler.h): the steps skipped in the run so far, or -1 when it is off.
  int64_t skipped_steps = -1;
  double lr = 0;  // the optimizer's learning rate this step
};

// What every loop does with a finished step: refuse a non-finite loss (with the fix; a step loss
// scaling skipped may have one), fill in the row's MFU, record the row, add it to the epoch's
// totals, and print the progress line every log_every steps.
void finish_step(io::RunRecorder& recorder, io::StepRecord rec, EpochTotals& totals,
                 const StepPlace& place);

// --profile DIR: libtorch's profiler (compat::Profiler) over --profile-steps steps, after the
// first kProfileSkip steps of this run (warm-up: allocator, cuBLAS heuristics, autotuning), each
// rank writing DIR/trace_rank<r>.json. Does nothing without --profile.
class StepProfiler {
 public:
  static constexpr int64_t kProfileSkip = 5;
  StepProfiler(const parallel::TrainConfig& cfg, const torch::Device& device, int rank,
               int64_t first_step);
  ~StepProfiler();
  void before_step(int64_t step);
  void after_step(int64_t step);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// After finish_step: counts the step, calls `save` every `save_every` steps (> 0), and returns true
// when `max_steps` (> 0) is reached and the run must stop. `stopping` (a stop signal): returns
// true without saving (the caller saves once, whatever save_every says).
bool advance_step(int64_t& step, int64_t save_every, int64_t max_steps,
                  const std::function<void()>& save, bool stopping = false);

// The stop signal (core/stop_signal.h) any rank received, agreed over `control` after every step
// so that all ranks stop after the same one; 0 when none. One tiny MPI all_reduce.
int stop_requested(comm::Communicator& control);

// A resumed state must lie inside this run: its epoch at most --epochs (a finished run's own
// end), its batch inside the epoch. Throws naming the checkpoint and both values otherwise.
void check_resume_position(const model::TrainState& state, const TrainConfig& cfg,
                           int64_t batches_per_epoch);

// The configuration a checkpoint records: to_json(cfg), and what the run trains on (the tokenizer's
// identity, the training split's fingerprint: TrainData).
nlohmann::json recorded_config(const TrainConfig& cfg, const TrainData& data);

// A resume continues the run its checkpoint recorded (state.config, as recorded_config wrote
// it). Another tokenizer or training data, or another --seed, --max-train-pairs, --batch-size or
// --seq-len (which decide the data order and so the position), is refused; any other setting
// that differs gets one line on rank 0 naming the old and the new value. A checkpoint that
// records no identity (an older version's) gets a note that it was not checked.
void check_resume_identity(const model::TrainState& state, const TrainConfig& cfg,
                           const TrainData& data, int rank);

// Rank 0's record of a stop: the line saying where the checkpoint is and the command that
// continues it on `world` ranks (its settings come from the run's config file), and
// <out>/stopped.json, written atomically once the checkpoint is committed. A launcher whose mpirun
// exits 1 after a signal of its own (Open MPI does, whatever the ranks returned) tells by that
// file that the ranks stopped cleanly (scripts/launch).
void report_stopped(const char* program, int signal, int64_t step, const std::string& out, int rank,
                    int world);

// Rank 0's last line of a run that ended without a stop: where its results are (the `ranks`
// timing files, which every rank has closed by then; config.ini and the checkpoint where they
// exist) and the command that turns them into plots.
void report_finished(const char* program, int64_t step, const std::string& out, int rank,
                     int ranks);

// Rank 0 removes a <out>/stopped.json left by an earlier run: the file speaks of one run only.
void clear_stopped(const std::string& out, int rank);

// The epoch boundary: returns where a resume continues (the next batch of this epoch when the run
// stopped inside it, else the start of the next epoch), moves `data` to the next epoch and prints
// HW5's per-rank line. It also reads the device's peak memory into `totals`: training's peak,
// before evaluation (whose full logits would otherwise count) runs.
data::SamplerPosition end_epoch(TrainData& data, int64_t epoch, bool stopped, int rank,
                                EpochTotals& totals, const torch::Device& device);

// The /epochs row of an epoch: HW5's time and tokens/s and the training peak memory from `totals`,
// the validation result and BLEU (NaN when not measured).
io::EpochRecord epoch_record(int64_t epoch, const EpochTotals& totals, double val_loss,
                             double val_ppl, double bleu);

}  // namespace gpt2p::parallel
