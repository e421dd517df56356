#include "gpt2p/parallel/train/loop.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "gpt2p/cli/main_guard.h"
#include "gpt2p/compat/device.h"
#include "gpt2p/parallel/train/checkpoint_commit.h"
#include "gpt2p/parallel/train/common.h"

namespace gpt2p::parallel {

int run_training(const LoopContext& ctx, TrainData& data, io::RunRecorder& recorder,
                 const model::TrainState& state, const LoopSetup& setup, StepStrategy& strategy) {
  const auto& cfg = ctx.cfg;
  clear_stopped(cfg.output.out, setup.rank);
  // One start for all ranks: every rank's times count from here, so stages line up in timelines.
  ctx.comm.barrier();
  const auto run_start = Clock::now();
  const auto now = [&] { return std::chrono::duration<double>(Clock::now() - run_start).count(); };
  const int64_t per_epoch = data.batches_per_epoch();
  const std::string checkpoint = cfg.output.out + "/checkpoint";
  int64_t step = state.step;
  int64_t saved_step = state.step;  // the step the newest checkpoint holds (a resume's own)
  const auto save = [&](int64_t epoch, int64_t next_batch) {
    const auto at = resume_point(epoch, next_batch, per_epoch);
    model::TrainState saved;
    saved.step = step;
    saved.epoch = at.epoch;
    saved.batch_in_epoch = at.batch;
    saved.seed = cfg.optim.seed;
    saved.config = recorded_config(cfg, data);
    if (setup.scaler != nullptr) {
      const LossScaleState scaling = setup.scaler->state();
      saved.loss_scale = scaling.scale;
      saved.loss_scale_good_steps = scaling.good_steps;
      saved.skipped_steps = scaling.skipped_steps;
    }
    strategy.save(checkpoint, saved);
    saved_step = step;
  };
  // Where a run that ends now would resume: after the last step taken.
  int64_t end_epoch_at = state.epoch, end_batch_at = data.position().batch;
  double run_peak = 0;  // bytes: the largest epoch training peak (evaluation left out)
  const auto stopped = [&](int signal) {
    strategy.record_attributes(recorder);
    recorder.close();
    report_stopped(setup.program, signal, step, cfg.output.out, setup.rank, ctx.control.size());
    return cli::kExitStopped;
  };
  StepProfiler profiler(cfg, ctx.device, setup.rank, state.step);
  // A checkpoint already at --max-steps (a resume of a finished run) has nothing left to train.
  bool done = cfg.optim.max_steps > 0 && step >= cfg.optim.max_steps;
  if (done && setup.rank == 0) {
    std::printf("%s: nothing to train: the run is at step %lld and --max-steps is %lld\n",
                setup.program, static_cast<long long>(step),
                static_cast<long long>(cfg.optim.max_steps));
    std::fflush(stdout);
  }
  int stopped_by = 0;  // the signal that stopped the run
  for (int64_t epoch = state.epoch; epoch < cfg.optim.epochs && !done; ++epoch) {
    strategy.set_training(true);
    compat::reset_peak_memory(ctx.device);
    EpochTotals totals;
    bool last_batch = false;  // the run stopped after the epoch's last batch
    for (int64_t b = data.position().batch; b < per_epoch; ++b) {
      io::StepRecord rec;
      rec.step = step;
      rec.epoch = epoch;
      profiler.before_step(step);
      rec.start = now();
      const bool more =
          b + 1 < per_epoch && (cfg.optim.max_steps == 0 || step + 1 < cfg.optim.max_steps);
      const double run_flops = strategy.step(rec, more);
      rec.end = now();
      finish_step(
          recorder, rec, totals,
          {epoch, cfg.optim.epochs, b, per_epoch, cfg.output.log_every, setup.rank == 0,
           setup.tokens_factor, ctx.peak_flops, run_flops, setup.ranks,
           setup.scaler != nullptr && setup.scaler->enabled() ? setup.scaler->state().skipped_steps
                                                              : -1,
           cfg.optim.lr});
      profiler.after_step(step);
      stopped_by = stop_requested(ctx.control);
      end_epoch_at = epoch;
      end_batch_at = b + 1;
      if (advance_step(
              step, cfg.output.save_every, cfg.optim.max_steps, [&] { save(epoch, b + 1); },
              stopped_by != 0)) {
        strategy.cancel_next();
        if (stopped_by != 0) save(epoch, b + 1);
        done = true;
        last_batch = b + 1 == per_epoch;
        break;
      }
    }
    // A stop inside the epoch ends the run here; on the epoch's last batch the epoch's row is
    // written first, below (evaluation ends at its first batch), for the resume starts the next
    // epoch.
    if (stopped_by != 0 && !last_batch) return stopped(stopped_by);
    // HW5's per-rank line, then evaluation (not part of the training time).
    const data::SamplerPosition resume_at =
        end_epoch(data, epoch, done, setup.rank, totals, ctx.device);
    run_peak = std::max(run_peak, totals.peak_memory_bytes);
    strategy.set_training(false);
    // A stop during evaluation ends it between batches (agreed, as after a step): the epoch's
    // training is then committed at once instead of after the rest of the evaluation.
    const bool stopped_in_training = stopped_by != 0;
    const StopCheck stop = [&] {
      if (stopped_by == 0) stopped_by = stop_requested(ctx.control);
      return stopped_by != 0;
    };
    const EpochEval val = strategy.evaluate(epoch, stop);
    if (!val.stopped) stop();  // also a signal that came during rank 0's translations
    recorder.epoch(epoch_record(epoch, totals, val.loss, val.perplexity, val.bleu));
    if ((cfg.output.save_every == 0 || stopped_by != 0) && !stopped_in_training) {
      save(resume_at.epoch, resume_at.batch);
    }
    // Evaluation and the checkpoints must not leak into another rank's next timed step.
    if (setup.ranks > 1) ctx.comm.barrier();
    if (stopped_by != 0) {
      recorder.set_attribute("peak_memory_bytes", run_peak);
      return stopped(stopped_by);
    }
  }
  // --save-every N commits every N steps; a finished run also commits its last steps.
  if (cfg.output.save_every > 0 && saved_step != step) save(end_epoch_at, end_batch_at);
  recorder.set_attribute("peak_memory_bytes", run_peak);
  strategy.record_attributes(recorder);
  recorder.close();
  if (setup.ranks > 1) ctx.comm.barrier();
  report_finished(setup.program, step, cfg.output.out, setup.rank, setup.ranks);
  return 0;
}

int run_training(const RunContext& ctx, TrainData& data, io::RunRecorder& recorder,
                 const model::TrainState& state, const LoopSetup& setup, StepStrategy& strategy) {
  return run_training(
      LoopContext{ctx.cfg, ctx.device, ctx.step_comm(), *ctx.control, ctx.peak_flops}, data,
      recorder, state, setup, strategy);
}

}  // namespace gpt2p::parallel
