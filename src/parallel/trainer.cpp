#include "gpt2p/parallel/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "gpt2p/cli/main_guard.h"
#include "gpt2p/core/compat.h"
#include "gpt2p/core/error.h"
#include "gpt2p/core/stop_signal.h"
#include "gpt2p/model/checkpoint.h"
#include "gpt2p/model/flops.h"
#include "gpt2p/parallel/checkpoint_commit.h"
#include "gpt2p/parallel/evaluator.h"
#include "gpt2p/parallel/grad_norm.h"
#include "gpt2p/parallel/grad_sync.h"
#include "gpt2p/parallel/run_context.h"
#include "gpt2p/parallel/train_common.h"
#include "gpt2p/parallel/train_data.h"

namespace gpt2p::parallel {
namespace {

// Everything one optimizer step needs, so the loop below reads as the algorithm.
struct Step {
  io::StepRecord rec;
  double local_loss_sum = 0;  // sum of masked CE over this rank's target tokens
};

}  // namespace

int train_data_parallel(const cli::TrainConfig& cfg_in, cli::Program program, const Topology& topo) {
  const char* name = program == cli::Program::kSingle ? "gpt2_train" : "dp_train";
  const StopSignals signals;  // SIGTERM/SIGINT: checkpoint after the step, then exit
  auto ctx = make_run_context(cfg_in, program, topo);
  const auto& cfg = ctx.cfg;
  GPT2P_CHECK(program != cli::Program::kSingle || topo.size == 1,
              "gpt2_train is the single-rank trainer but runs on " << topo.size << " ranks",
              "use mpirun -np N dp_train for data parallelism");
  const int world = topo.size;
  const int rank = topo.rank;
  GPT2P_CHECK(cfg.batch_size % world == 0,
              "--batch-size " << cfg.batch_size << " (global) does not divide over " << world << " ranks",
              "pass a global batch that is a multiple of the number of ranks");

  std::optional<TrainData> opened;
  open_train_data(ctx, rank, world, opened);
  TrainData& data = *opened;
  const int64_t micro = data.local_batch() / cfg.grad_accum;
  GPT2P_CHECK(micro * cfg.grad_accum == data.local_batch(),
              "per-rank batch " << data.local_batch() << " does not split into --grad-accum "
                                << cfg.grad_accum << " micro-steps",
              "pick --grad-accum dividing --batch-size / ranks");

  torch::manual_seed(cfg.seed + static_cast<uint64_t>(rank));  // dropout differs per rank
  model::GPT2 model(ctx.model_config);
  model->reset_parameters(cfg.seed);
  if (!cfg.init_from.empty()) {
    cli::on_every_rank([&] { init_from(model, cfg.init_from); }, ctx.checkpoint_timeout());
  }
  model->to(ctx.device);
  model->set_kernels(ctx.kernels);
  if (world > 1) broadcast_parameters(model, *ctx.comm);
  auto params = model->parameters();
  compat::FusedAdamW optimizer(params,
                               torch::optim::AdamWOptions(cfg.lr).weight_decay(cfg.weight_decay));

  model::TrainState state;
  if (!cfg.resume.empty()) {
    // Agreed before anything is written (see pp_trainer.cpp).
    cli::on_every_rank(
        [&] {
          state = model::load_checkpoint(cfg.resume, *model, &optimizer);
          compat::set_rng_state(ctx.device, rank_rng_state(state, rank, world));
        },
        ctx.checkpoint_timeout());
    data.set_position({state.epoch, state.batch_in_epoch});
  }
  const auto reduce_dtype = cfg.reduce_dtype == "bf16" ? torch::kBFloat16 : torch::kFloat32;
  auto sync = make_grad_sync(world == 1 ? "none" : cfg.grad_sync, ctx.comm.get(), params,
                             cfg.bucket_mb, reduce_dtype,
                             cfg.embedding_sync == "sparse" ? model->tied_parameter() : torch::Tensor());
  if (auto sink = sync->embedding_sink()) model->set_embedding_grad_sink(std::move(sink));

  // A resumed run continues its rank files (the steps before the checkpoint stay recorded).
  io::RunRecorder recorder(cfg.out, run_identity(ctx, name),
                           cfg.resume.empty() ? io::RecordMode::kCreate : io::RecordMode::kAppend);
  const bool bf16 = cfg.precision == "bf16";
  const auto positions = model::parse_loss_positions(cfg.loss_positions);
  const int64_t vocab = ctx.model_config.vocab_size;
  const auto logits_fn = [&](const torch::Tensor& ids) {
    compat::AutocastGuard autocast(ctx.device, bf16);
    return model->forward(ids).to(torch::kFloat32);
  };
  if (rank == 0) {
    std::printf("%s: %d rank(s) on %s, model %s, %lld training pairs, global batch %lld x %lld tokens, "
                "sync %s, %s\n",
                name, world, ctx.device.is_cuda() ? compat::device_name(ctx.device).c_str() : "cpu",
                model::describe(ctx.model_config).c_str(), static_cast<long long>(data.train_pairs()),
                static_cast<long long>(cfg.batch_size), static_cast<long long>(cfg.seq_len),
                sync->name().c_str(), ctx.describe_kernels().c_str());
    std::fflush(stdout);
  }

  // One start for all ranks: every rank's times count from here, so stages line up in timelines.
  ctx.comm->barrier();
  const auto run_start = Clock::now();
  const int64_t per_epoch = data.batches_per_epoch();
  compat::DeviceClock clock(ctx.device, 2 * cfg.grad_accum + 3);
  int64_t step = state.step;
  bool done = false;
  const std::string checkpoint = cfg.out + "/checkpoint";
  const auto save = [&](int64_t epoch, int64_t next_batch) {
    const auto at = resume_point(epoch, next_batch, per_epoch);
    save_replicated_checkpoint(ctx, checkpoint, *model, optimizer,
                               {step, at.epoch, at.batch, cfg.seed, {}, cli::to_json(cfg), {}});
  };
  int stopped_by = 0;  // the signal that stopped the run
  StepProfiler profiler(cfg, ctx.device, rank, state.step);
  // A step's batch on the device and its loss rows. The next step's is prepared while the GPU
  // still works on this one (after the optimizer is queued, before the host waits for the step):
  // the host's part -- sampling, pinned copies, loss rows -- then leaves no gap on the GPU.
  struct Prepared {
    TrainData::Step batch;
    DeviceBatch dev;
    std::vector<model::LossRows> rows;
    double host_seconds = 0;
  };
  const auto prepare = [&] {
    const auto t = Clock::now();
    Prepared p;
    p.batch = data.next();
    p.dev = to_device(p.batch.batch, ctx.device);
    // The head runs only where the loss counts; weights scaled so that averaging gradients over
    // `world` ranks gives the gradient of the global batch's mean (train_data.h).
    p.rows = model::loss_rows(p.dev.labels, host_mask(p.batch.batch), cfg.grad_accum,
                              static_cast<double>(world) /
                                  static_cast<double>(std::max<int64_t>(1, p.batch.global_target_tokens)),
                              positions);
    p.host_seconds = since(t);
    return p;
  };
  std::optional<Prepared> ahead;
  data::SamplerPosition before_ahead;  // where the data stood before `ahead` was taken from it

  double run_peak = 0;  // bytes: the largest epoch training peak
  for (int64_t epoch = state.epoch; epoch < cfg.epochs && !done; ++epoch) {
    model->train();
    compat::reset_peak_memory(ctx.device);
    EpochTotals totals;
    bool last_batch = false;  // the run stopped after the epoch's last batch
    for (int64_t b = data.position().batch; b < per_epoch; ++b) {
      io::StepRecord rec;
      rec.step = step;
      rec.epoch = epoch;
      profiler.before_step(step);
      const auto t0 = Clock::now();
      rec.start = std::chrono::duration<double>(t0 - run_start).count();
      Prepared cur = ahead ? std::move(*ahead) : prepare();
      ahead.reset();
      const auto& batch = cur.batch;
      const auto& dev = cur.dev;
      const auto& rows = cur.rows;
      rec.data = cur.host_seconds;
      clock.mark(0);
      torch::Tensor loss_sum = torch::zeros({}, torch::TensorOptions().device(ctx.device));
      for (int k = 0; k < cfg.grad_accum; ++k) {
        torch::Tensor loss;
        {
          compat::AutocastGuard autocast(ctx.device, bf16);
          loss = model->loss(dev.inputs.narrow(0, k * micro, micro), rows[static_cast<size_t>(k)],
                             bf16);
        }
        clock.mark(1 + 2 * k);
        sync->begin_backward(k + 1 == cfg.grad_accum);
        loss.backward();
        clock.mark(2 + 2 * k);
        loss_sum += loss.detach();
      }
      sync->end_backward();
      const int sync_mark = 2 * cfg.grad_accum + 1;
      clock.mark(sync_mark);
      if (cfg.grad_clip > 0) clip_grad_norm_queued(params, cfg.grad_clip);
      optimizer.step();
      for (auto& p : params) p.mutable_grad() = torch::Tensor();
      clock.mark(sync_mark + 1);
      if (b + 1 < per_epoch && (cfg.max_steps == 0 || step + 1 < cfg.max_steps)) {
        before_ahead = data.position();
        ahead = prepare();
      }
      const auto times = sync->finish_step();
      for (int k = 0; k < cfg.grad_accum; ++k) {
        rec.forward += clock.elapsed(2 * k, 1 + 2 * k);
        rec.backward += clock.elapsed(1 + 2 * k, 2 + 2 * k);
      }
      rec.sync_exposed = clock.elapsed(sync_mark - 1, sync_mark);
      rec.sync_total = std::max(times.total, rec.sync_exposed);
      rec.optimizer = clock.elapsed(sync_mark, sync_mark + 1);
      rec.end = std::chrono::duration<double>(Clock::now() - run_start).count();
      rec.padded_tokens = batch.batch.padded_tokens;
      rec.target_tokens = batch.batch.target_tokens;
      // loss_sum = local masked CE sum * world / global targets; report this rank's mean.
      const double local_sum = loss_sum.item<double>() * static_cast<double>(batch.global_target_tokens) / world;
      rec.loss = batch.batch.target_tokens > 0 ? local_sum / static_cast<double>(batch.batch.target_tokens) : 0.0;
      rec.lr = cfg.lr;
      rec.flops = model::training_flops(
          ctx.model_config, 0, ctx.model_config.num_stage_layers(), rec.padded_tokens, cfg.seq_len,
          positions == model::LossPositions::kAll ? rec.padded_tokens : rec.target_tokens);
      finish_step(recorder, rec, totals,
                  {epoch, cfg.epochs, b, per_epoch, cfg.log_every, rank == 0,
                   static_cast<double>(world), ctx.peak_flops, rec.flops * world, world});
      profiler.after_step(step);
      stopped_by = stop_requested(*ctx.control);
      if (advance_step(step, cfg.save_every, cfg.max_steps, [&] { save(epoch, b + 1); },
                       stopped_by != 0)) {
        if (ahead) {  // a stop: the prepared batch goes back, position() is the next one again
          data.set_position(before_ahead);
          ahead.reset();
        }
        if (stopped_by != 0) save(epoch, b + 1);
        done = true;
        last_batch = b + 1 == per_epoch;
        break;
      }
    }
    // A stop inside the epoch ends the run here; on the epoch's last batch the epoch's end
    // (evaluation, its row) runs first, below, for the resume starts the next epoch.
    if (stopped_by != 0 && !last_batch) {
      recorder.close();
      report_stopped(name, stopped_by, step, checkpoint, rank);
      return cli::kExitStopped;
    }
    // HW5's per-rank line, then evaluation (not part of the training time).
    const data::SamplerPosition resume_at = end_epoch(data, epoch, done, rank, totals, ctx.device);
    run_peak = std::max(run_peak, totals.peak_memory_bytes);
    // Averaged gradients keep the replicas bitwise equal; a difference is a sync bug, caught here
    // rather than as a quietly worse model.
    if (world > 1) {
      check_replicas(model, *ctx.comm, "at the end of epoch " + std::to_string(epoch + 1),
                     "the data-parallel replicas diverged: rerun with --grad-sync per-param or "
                     "--embedding-sync dense and report the run");
    }
    model->eval();
    const auto val = validation_loss(logits_fn, data.dataset().split("validation"),
                                     cfg.max_eval_pairs, micro, cfg.seq_len, data.special(), vocab,
                                     ctx.device, world > 1 ? ctx.comm.get() : nullptr);
    double bleu = std::nan("");
    if (rank == 0 && cfg.translate_samples > 0) {
      const auto samples = translate(logits_fn, data.dataset().split("test"), cfg.translate_samples,
                                     cfg.seq_len, data.special(), vocab, ctx.tokenizer, ctx.device);
      bleu = translations_bleu(samples);
      for (const auto& t : samples) {
        std::printf("  de: %s\n  en: %s\n  model: %s\n", t.source.c_str(), t.reference.c_str(),
                    t.hypothesis.c_str());
      }
    }
    if (rank == 0) {
      std::printf("epoch %lld: validation loss %.4f perplexity %.2f", static_cast<long long>(epoch + 1),
                  val.loss, val.perplexity);
      if (cfg.translate_samples > 0) {
        std::printf(", BLEU (%d test pairs) %.2f", static_cast<int>(cfg.translate_samples), bleu);
      }
      std::printf("\n");
      std::fflush(stdout);
    }
    recorder.epoch(epoch_record(epoch, totals, val.loss, val.perplexity, bleu));
    if (cfg.save_every == 0 && stopped_by == 0) save(resume_at.epoch, resume_at.batch);
    // Evaluation and rank 0's checkpoint must not leak into another rank's next timed step.
    if (world > 1) ctx.comm->barrier();
    if (stopped_by != 0) {
      recorder.set_attribute("peak_memory_bytes", run_peak);
      recorder.close();
      report_stopped(name, stopped_by, step, checkpoint, rank);
      return cli::kExitStopped;
    }
  }
  recorder.set_attribute("peak_memory_bytes", run_peak);  // training's, evaluation left out
  recorder.close();
  if (world > 1) ctx.comm->barrier();
  return 0;
}

}  // namespace gpt2p::parallel
