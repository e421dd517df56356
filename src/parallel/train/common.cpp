#include "gpt2p/parallel/train/common.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "gpt2p/compat/device.h"
#include "gpt2p/compat/profiler.h"
#include "gpt2p/core/atomic_file.h"
#include "gpt2p/core/error.h"
#include "gpt2p/core/process_info.h"
#include "gpt2p/core/stop_signal.h"
#include "gpt2p/io/run_info.h"
#include "gpt2p/parallel/train/flags.h"

namespace gpt2p::parallel {

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

DeviceBatch to_device(const data::Batch& b, const torch::Device& device) {
  const std::vector<int64_t> shape{b.batch_size, b.seq_len};
  auto copy = [&](const void* ptr, torch::ScalarType t) {
    auto host = torch::from_blob(const_cast<void*>(ptr), shape, t);
    if (device.is_cuda()) return host.pin_memory().to(device, /*non_blocking=*/true);
    return host.clone();
  };
  return {copy(b.inputs.data(), torch::kInt64), copy(b.labels.data(), torch::kInt64),
          copy(b.mask.data(), torch::kFloat32)};
}

torch::Tensor host_mask(const data::Batch& b) {
  return torch::from_blob(const_cast<float*>(b.mask.data()), {b.batch_size, b.seq_len},
                          torch::kFloat32);
}

std::string format_eta(double seconds) {
  const auto s = static_cast<long long>(seconds);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%lldh%02lldm%02llds", s / 3600, s / 60 % 60, s % 60);
  return buf;
}

void print_progress(int64_t epoch, int epochs, int64_t batch, int64_t per_epoch, double loss,
                    double step_seconds, double lr, double tokens_per_sec, double mfu,
                    double eta_seconds, const std::string& scaling) {
  char mfu_text[32] = "";
  if (std::isfinite(mfu)) std::snprintf(mfu_text, sizeof mfu_text, " mfu %.1f%%", 100 * mfu);
  std::printf(
      "epoch %lld/%d step %lld/%lld loss %.4f%s | %.1f ms/step lr %g | tok/s %.0f (all ranks)%s "
      "| eta %s\n",
      static_cast<long long>(epoch + 1), epochs, static_cast<long long>(batch + 1),
      static_cast<long long>(per_epoch), loss, scaling.c_str(), 1000 * step_seconds, lr,
      tokens_per_sec, mfu_text, format_eta(eta_seconds).c_str());
  std::fflush(stdout);
}

void print_epoch_time(int64_t epoch, int rank, double train_time, int64_t tokens) {
  std::printf(
      "Epoch %lld on Rank %d: Training Time = %.4f, Tokens_per_sec = %.1f   (HW5's line: "
      "epochs from 0, this rank's tokens)\n",
      static_cast<long long>(epoch), rank, train_time, static_cast<double>(tokens) / train_time);
  std::fflush(stdout);
}

void finish_step(io::RunRecorder& recorder, io::StepRecord rec, EpochTotals& totals,
                 const StepPlace& place) {
  GPT2P_CHECK(rec.skipped != 0 || std::isfinite(rec.loss),
              "loss became " << rec.loss << " at step " << rec.step,
              "lower --lr, or use --precision fp32");
  const double nan = std::nan("");
  const double seconds = rec.end - rec.start;
  const bool known = place.peak_flops > 0 && seconds > 0;
  rec.mfu = known ? rec.flops / seconds / place.peak_flops : nan;
  const double run_mfu = known ? place.run_flops / seconds / (place.peak_flops * place.ranks) : nan;
  recorder.step(rec);
  totals.time += rec.end - rec.start;
  totals.tokens += rec.padded_tokens;
  totals.targets += rec.target_tokens;
  const bool last = place.batch + 1 == place.per_epoch;
  if (place.prints && ((rec.step + 1) % place.log_every == 0 || last)) {
    const double step_time = rec.end - rec.start;
    const double remaining = static_cast<double>(
        (place.epochs - place.epoch - 1) * place.per_epoch + (place.per_epoch - place.batch - 1));
    char scaling[64] = "";
    if (place.skipped_steps >= 0) {
      std::snprintf(scaling, sizeof scaling, " scale %g (%lld skipped)", rec.loss_scale,
                    static_cast<long long>(place.skipped_steps));
    }
    print_progress(place.epoch, place.epochs, place.batch, place.per_epoch, rec.loss, step_time,
                   place.lr,
                   static_cast<double>(rec.padded_tokens) * place.tokens_factor / step_time,
                   run_mfu, remaining * step_time, scaling);
  }
}

struct StepProfiler::Impl {
  Impl(const torch::Device& device, std::string trace, int64_t first, int64_t last, bool print)
      : profiler(device), path(std::move(trace)), begin(first), end(last), prints(print) {}
  compat::Profiler profiler;
  std::string path;
  int64_t begin = 0, end = 0;  // steps [begin, end) are profiled
  bool prints = false;
};

StepProfiler::StepProfiler(const parallel::TrainConfig& cfg, const torch::Device& device, int rank,
                           int64_t first_step) {
  if (cfg.output.profile.empty()) return;
  impl_ = std::make_unique<Impl>(
      device, cfg.output.profile + "/trace_rank" + std::to_string(rank) + ".json",
      first_step + kProfileSkip, first_step + kProfileSkip + cfg.output.profile_steps, rank == 0);
}

// A run that ends inside the profiled steps (--max-steps, a stop signal, the last epoch) still
// writes what it profiled; unwinding from an error writes nothing.
StepProfiler::~StepProfiler() {
  if (!impl_ || !impl_->profiler.running() || std::uncaught_exceptions() > 0) return;
  try {
    impl_->profiler.stop(impl_->path);
    if (impl_->prints) {
      std::printf(
          "profile of steps %lld.. written to %s; the run ended before step %lld, the "
          "last one asked for\n",
          static_cast<long long>(impl_->begin), impl_->path.c_str(),
          static_cast<long long>(impl_->end - 1));
      std::fflush(stdout);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "warning: the profile could not be written: %s\n", e.what());
  }
}

void StepProfiler::before_step(int64_t step) {
  if (impl_ && step == impl_->begin) impl_->profiler.start();
}

void StepProfiler::after_step(int64_t step) {
  if (!impl_ || !impl_->profiler.running() || step + 1 != impl_->end) return;
  impl_->profiler.stop(impl_->path);
  if (impl_->prints) {
    std::printf("profile of steps %lld..%lld written to %s (every rank its own)\n",
                static_cast<long long>(impl_->begin), static_cast<long long>(impl_->end - 1),
                impl_->path.c_str());
    std::fflush(stdout);
  }
}

bool advance_step(int64_t& step, int64_t save_every, int64_t max_steps,
                  const std::function<void()>& save, bool stopping) {
  ++step;
  if (stopping) return true;
  if (save_every > 0 && step % save_every == 0) save();
  return max_steps > 0 && step >= max_steps;
}

int stop_requested(comm::Communicator& control) {
  // A library (MPI's, CUDA's, NCCL's threads) may take a stop signal over after the trainer set
  // its handlers: take it back, once said, so that a stop request is never silently lost.
  const std::string taken = StopSignals::reclaim();
  if (!taken.empty()) {
    std::fprintf(stderr,
                 "note: rank %d: a library had taken over %s after start-up; the stop "
                 "handlers are back in place\n",
                 control.rank(), taken.c_str());
    std::fflush(stderr);
  }
  auto flag = torch::tensor({StopSignals::received()}, torch::kInt32);
  if (control.size() > 1) {
    // The largest signal number any rank saw (SIGTERM 15 > SIGINT 2): one agreed answer.
    auto all = control.all_gather(flag);
    flag = all.max();
  }
  return flag.item<int>();
}

void report_stopped(const char* program, int signal, int64_t step, const std::string& out, int rank,
                    int world) {
  if (rank != 0) return;
  const std::string checkpoint = out + "/checkpoint";
  const nlohmann::json record{{"program", program},
                              {"signal", signal_name(signal)},
                              {"step", step},
                              {"checkpoint", checkpoint},
                              {"time", utc_timestamp()},
                              {"pid", static_cast<int64_t>(getpid())}};
  try {
    write_text_atomically(out + "/stopped.json", record.dump(1) + "\n");
  } catch (const std::exception& e) {
    // The checkpoint is committed all the same: a launcher then reports mpirun's own exit.
    std::fprintf(stderr, "%s: warning: %s\n", program, e.what());
  }
  // The settings and --out of the run come back from <out>/config.ini (train/flags.h). The program
  // by its path, which works whether or not it was installed where mpirun looks.
  std::error_code ec;
  const std::string exe = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  std::printf(
      "%s: stopped by signal %s after step %lld; checkpoint committed in %s; continue with: "
      "mpirun -np %d %s --resume %s\n",
      program, signal_name(signal), static_cast<long long>(step), checkpoint.c_str(), world,
      ec || exe.empty() ? program : exe.c_str(), checkpoint.c_str());
  std::fflush(stdout);
}

void report_finished(const char* program, int64_t step, const std::string& out, int rank,
                     int ranks) {
  if (rank != 0) return;
  std::error_code ec;
  std::string held =
      ranks == 1 ? "1 timing file rank0.h5" : std::to_string(ranks) + " timing files rank<r>.h5";
  if (std::filesystem::exists(out + "/" + kRunConfigFile, ec))
    held += std::string(", ") + kRunConfigFile + " (run it again with --config)";
  if (std::filesystem::exists(out + "/checkpoint", ec)) held += ", checkpoint/";
  std::printf(
      "%s: finished after step %lld; results in %s: %s; plots and metrics: python3 -m analysis "
      "summarize %s --out %s/analysis (from the source tree: scripts/python)\n",
      program, static_cast<long long>(step), out.c_str(), held.c_str(), out.c_str(), out.c_str());
  std::fflush(stdout);
}

void check_resume_position(const model::TrainState& state, const TrainConfig& cfg,
                           int64_t batches_per_epoch) {
  GPT2P_CHECK(state.epoch < cfg.optim.epochs ||
                  (state.epoch == cfg.optim.epochs && state.batch_in_epoch == 0),
              "checkpoint " << cfg.output.resume << " is at epoch " << state.epoch << " (batch "
                            << state.batch_in_epoch << "), past this run's --epochs "
                            << cfg.optim.epochs,
              "raise --epochs to continue it, or check that meta.json is the one this run wrote");
  GPT2P_CHECK(state.batch_in_epoch < batches_per_epoch,
              "checkpoint " << cfg.output.resume << " is at batch " << state.batch_in_epoch
                            << " of an epoch, but an epoch of this run has " << batches_per_epoch
                            << " batches",
              "resume with the --batch-size and --max-train-pairs of the run that wrote it");
}

nlohmann::json recorded_config(const TrainConfig& cfg, const TrainData& data) {
  auto j = to_json(cfg);
  j["tokenizer_identity"] = data.tokenizer_identity();
  j["train_fingerprint"] = data.train_fingerprint();
  return j;
}

void check_resume_identity(const model::TrainState& state, const TrainConfig& cfg,
                           const TrainData& data, int rank) {
  const auto& old = state.config;
  const std::string ck = "checkpoint " + cfg.output.resume;
  if (!old.is_object() || !old.contains("tokenizer_identity") ||
      !old.contains("train_fingerprint")) {
    if (rank == 0) {
      std::fprintf(stderr,
                   "note: %s records no tokenizer or training-data identity (an older "
                   "version wrote it): the resume's data is not checked against it\n",
                   ck.c_str());
    }
    if (!old.is_object()) return;
  }
  if (old.contains("tokenizer_identity")) {
    GPT2P_CHECK(old["tokenizer_identity"] == data.tokenizer_identity(),
                ck << " was trained with tokenizer " << old["tokenizer_identity"].dump()
                   << ", but --data " << cfg.data.path << " was made with "
                   << data.tokenizer_identity(),
                "resume on the dataset the run trained on (its --data and --vocab-dir)");
  }
  if (old.contains("train_fingerprint")) {
    GPT2P_CHECK(old["train_fingerprint"] == data.train_fingerprint(),
                ck << " was trained on other training data (fingerprint "
                   << old["train_fingerprint"].dump() << "; --data " << cfg.data.path << " has "
                   << data.train_fingerprint() << ")",
                "resume on the dataset the run trained on, or start a new run with --init-from "
                    << cfg.output.resume);
  }
  const auto now = to_json(cfg);
  // The data order and position depend on these: a resume cannot continue with others.
  for (const char* key : {"seed", "max_train_pairs", "batch_size", "seq_len"}) {
    if (!old.contains(key) || !now.contains(key) || old[key] == now[key]) continue;
    std::string flag = key;
    std::replace(flag.begin(), flag.end(), '_', '-');
    GPT2P_FAIL(ck << " was trained with --" << flag << " " << old[key].dump() << ", this run has "
                  << now[key].dump(),
               "resume with --" << flag << " " << old[key].dump()
                                << " (it decides the data order), or start a new run with "
                                   "--init-from "
                                << cfg.output.resume);
  }
  if (rank != 0) return;
  for (const auto& [key, value] : now.items()) {
    if (key == "out" || key == "resume" || key == "overwrite" || key == "init_from" ||
        !old.contains(key) || old[key] == value) {
      continue;
    }
    std::string flag = key;
    std::replace(flag.begin(), flag.end(), '_', '-');
    // Before the options were resolved once, the record kept --loss-scale auto as given.
    if (key == "loss_scale" && old[key] == "auto") continue;
    std::fprintf(stderr, "note: resuming with --%s %s; the checkpoint's run had %s\n", flag.c_str(),
                 value.dump().c_str(), old[key].dump().c_str());
  }
  std::fflush(stderr);
  std::printf("resumed from %s after step %lld (epoch %lld, batch %lld of it); writing to %s\n",
              cfg.output.resume.c_str(), static_cast<long long>(state.step),
              static_cast<long long>(state.epoch + 1), static_cast<long long>(state.batch_in_epoch),
              cfg.output.out.c_str());
  std::fflush(stdout);
}

void clear_stopped(const std::string& out, int rank) {
  const std::string path = out + "/stopped.json";
  // Not fatal on one rank alone: a launcher also checks the file is newer than its launch.
  if (rank == 0 && !remove_tree(path)) {
    std::fprintf(stderr,
                 "warning: %s: cannot remove the record of an earlier stop: %s -- check "
                 "the permissions of %s\n",
                 path.c_str(), std::strerror(errno), out.c_str());
    std::fflush(stderr);
  }
}

data::SamplerPosition end_epoch(TrainData& data, int64_t epoch, bool stopped, int rank,
                                EpochTotals& totals, const torch::Device& device) {
  totals.peak_memory_bytes = static_cast<double>(compat::peak_memory_bytes(device));
  const data::SamplerPosition resume_at =
      stopped ? data.position() : data::SamplerPosition{epoch + 1, 0};
  data.set_position({epoch + 1, 0});
  print_epoch_time(epoch, rank, totals.time, totals.tokens);
  return resume_at;
}

io::EpochRecord epoch_record(int64_t epoch, const EpochTotals& totals, double val_loss,
                             double val_ppl, double bleu) {
  io::EpochRecord er;
  er.epoch = epoch;
  er.train_time = totals.time;
  er.padded_tokens = totals.tokens;
  er.tokens_per_sec = static_cast<double>(totals.tokens) / totals.time;
  er.target_tokens_per_sec = static_cast<double>(totals.targets) / totals.time;
  er.val_loss = val_loss;
  er.val_ppl = val_ppl;
  er.bleu = bleu;
  er.peak_memory_bytes = totals.peak_memory_bytes;
  return er;
}

}  // namespace gpt2p::parallel
