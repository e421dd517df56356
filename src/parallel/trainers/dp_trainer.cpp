#include "gpt2p/parallel/trainers/dp_trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>

#include "gpt2p/cli/main_guard.h"
#include "gpt2p/cli/options.h"
#include "gpt2p/compat/adamw.h"
#include "gpt2p/compat/device.h"
#include "gpt2p/compat/rng.h"
#include "gpt2p/core/error.h"
#include "gpt2p/core/stop_signal.h"
#include "gpt2p/model/checkpoint.h"
#include "gpt2p/model/flops.h"
#include "gpt2p/parallel/data_parallel/reducer.h"
#include "gpt2p/parallel/train/checkpoint_commit.h"
#include "gpt2p/parallel/train/common.h"
#include "gpt2p/parallel/train/context.h"
#include "gpt2p/parallel/train/data.h"
#include "gpt2p/parallel/train/evaluator.h"
#include "gpt2p/parallel/train/flags.h"
#include "gpt2p/parallel/train/graphed_step.h"
#include "gpt2p/parallel/train/loop.h"
#include "gpt2p/parallel/train/loss_scaler.h"

namespace gpt2p::parallel {
namespace {

// Why this run's step cannot be one CUDA graph (graphed_step.h), or "" when it can.
std::string dp_graph_blocker(const RunContext& ctx, const LossScaler& scaler) {
  if (auto why = graph_blocker(ctx.cfg, ctx.device); !why.empty()) return why;
  if (ctx.topo.size > 1) return "the gradients' all-reduce between ranks is not captured";
  if (ctx.cfg.data_parallel.zero == 1) return "--zero 1's parameter gathers are not captured";
  if (scaler.enabled()) return "dynamic loss scaling reads the gradient norm on the host";
  if (scaler.injects_faults()) return "GPT2P_INJECT_NONFINITE_GRADS is set";
  return "";
}

// One data-parallel optimizer step: every rank runs forward and backward on its share of the
// global batch (in --grad-accum micro-steps), the gradients are averaged (`sync`), then clipped
// and applied. The next step's batch is prepared while the GPU still works on this one (after the
// optimizer is queued, before the host reads the step's clocks): the host's part -- sampling,
// pinned copies, loss rows -- then leaves no gap on the GPU. The reducer (reducer.h) holds the
// optimizer; with --zero 1 its parameter gathers run while the next batch is prepared.
class DataParallelStep final : public StepStrategy {
 public:
  DataParallelStep(const RunContext& ctx, TrainData& data, model::GPT2 model, GradReducer& reducer,
                   LossScaler& scaler)
      : ctx_(ctx),
        cfg_(ctx.cfg),
        data_(data),
        model_(std::move(model)),
        reducer_(reducer),
        scaler_(scaler),
        world_(ctx.topo.size),
        micro_(data.local_batch() / ctx.cfg.optim.grad_accum),
        positions_(ctx.cfg.compute.loss_positions),
        clock_(ctx.device, 2 * ctx.cfg.optim.grad_accum + 3),
        graph_(ctx.device, dp_graph_blocker(ctx, scaler), ctx.topo.rank == 0) {}

  // "on" or "off (<why>)", for the start-up line.
  std::string describe_graphs() const { return graph_.describe(); }

  void set_training(bool training) override { training ? model_->train() : model_->eval(); }

  double step(io::StepRecord& rec, bool more) override {
    Prepared cur = ahead_ ? std::move(*ahead_) : prepare();
    ahead_.reset();
    const auto& batch = cur.batch;
    rec.data = cur.host_seconds;
    const double scale = scaler_.scale();
    bool apply = true;
    // The step's device work, from the first forward to the optimizer, as the graph captures it
    // (graphed_step.h): it reads the batch from `in` alone -- the inputs [B, T], then each
    // micro-step's loss rows (index, labels, weights) -- and returns the summed loss.
    const auto body = [&](const GraphedStep::Tensors& in) -> GraphedStep::Tensors {
      std::vector<model::LossRows> rows(cur.rows.size());
      for (size_t k = 0; k < rows.size(); ++k) {
        rows[k] = {in[1 + 3 * k], in[2 + 3 * k], in[3 + 3 * k]};
      }
      return {device_step(in[0], rows, scale, rec.step, apply)};
    };
    GraphedStep::Tensors in{cur.dev.inputs};
    for (const auto& r : cur.rows) in.insert(in.end(), {r.index, r.labels, r.weights});
    const torch::Tensor loss_sum = graph_
                                       .run(
                                           in, body, [&] { return reducer_.capturable(); },
                                           [&] { reducer_.count_replayed_step(); })
                                       .front();
    rec.loss_scale = scale;
    rec.skipped = apply ? 0 : 1;
    const int sync_mark = 2 * cfg_.optim.grad_accum + 1;
    // finish_step stamps the sync's end on the host: before the next batch's preparation, which
    // must not count as synchronisation.
    const auto times = reducer_.finish_step();
    if (more) {
      before_ahead_ = data_.position();
      ahead_ = prepare();
    }
    reducer_.wait_params();
    for (int k = 0; k < cfg_.optim.grad_accum; ++k) {
      rec.forward += clock_.elapsed(2 * k, 1 + 2 * k);
      rec.backward += clock_.elapsed(1 + 2 * k, 2 + 2 * k);
    }
    rec.sync_exposed = clock_.elapsed(sync_mark - 1, sync_mark);
    rec.sync_total = std::max(times.total, rec.sync_exposed);
    rec.optimizer = clock_.elapsed(sync_mark, sync_mark + 1);
    rec.padded_tokens = batch.batch.padded_tokens;
    rec.target_tokens = batch.batch.target_tokens;
    // loss_sum = local masked CE sum * world / global targets; report this rank's mean.
    const double local_sum =
        loss_sum.item<double>() / scale * static_cast<double>(batch.global_target_tokens) / world_;
    rec.loss = batch.batch.target_tokens > 0
                   ? local_sum / static_cast<double>(batch.batch.target_tokens)
                   : 0.0;
    rec.lr = cfg_.optim.lr;
    rec.flops = model::training_flops(
        ctx_.model_config, 0, ctx_.model_config.num_stage_layers(), rec.padded_tokens,
        cfg_.optim.seq_len,
        positions_ == model::LossPositions::kAll ? rec.padded_tokens : rec.target_tokens);
    return rec.flops * world_;
  }

  // Forward and backward of every micro-step, the gradients' sync, clipping and the optimizer:
  // the clock's marks 0 .. 2 * grad_accum + 2 around them. Returns the summed loss (queued).
  // `apply`: false when dynamic loss scaling skips the step (the only host read; a run that
  // scales its loss is not captured).
  torch::Tensor device_step(const torch::Tensor& inputs, const std::vector<model::LossRows>& rows,
                            double scale, int64_t step, bool& apply) {
    clock_.mark(0);
    torch::Tensor loss_sum = torch::zeros({}, torch::TensorOptions().device(ctx_.device));
    // With --grad-accum, the weights are cast to bf16/fp16 once for all micro-steps.
    std::optional<compat::AutocastCacheScope> casts;
    if (cfg_.optim.grad_accum > 1) casts.emplace();
    for (int k = 0; k < cfg_.optim.grad_accum; ++k) {
      torch::Tensor loss;
      {
        compat::AutocastGuard autocast(ctx_.device, ctx_.autocast);
        loss = model_->loss(inputs.narrow(0, k * micro_, micro_),
                            model::scaled(rows[static_cast<size_t>(k)], scale), ctx_.autocast);
      }
      clock_.mark(1 + 2 * k);
      reducer_.begin_backward(k + 1 == cfg_.optim.grad_accum);
      loss.backward();
      clock_.mark(2 + 2 * k);
      loss_sum += loss.detach();
    }
    casts.reset();
    reducer_.finish_grad_sync();
    const int sync_mark = 2 * cfg_.optim.grad_accum + 1;
    clock_.mark(sync_mark);
    // The gradients are unscaled while clipped; with loss scaling the host reads their norm and
    // the ranks agree to skip a step whose gradients overflowed.
    apply = true;
    if (cfg_.optim.grad_clip > 0 || scaler_.enabled()) {
      if (scaler_.injects_fault(ctx_.topo.rank, step)) {
        // GPT2P_INJECT_NONFINITE_GRADS (loss_scaler.h): this rank's summed gradients become NaN.
        reducer_.scale_grads(
            torch::full({}, std::nan(""), torch::TensorOptions().device(ctx_.device)));
      }
      const auto norm = reducer_.clip_grad_norm(cfg_.optim.grad_clip, 1 / scale);
      if (scaler_.enabled()) {
        apply = scaler_.update(std::isfinite(norm.item<double>()), ctx_.control.get(), step);
      }
    }
    if (apply) reducer_.step();
    reducer_.zero_grad();
    clock_.mark(sync_mark + 1);
    return loss_sum;
  }

  void record_attributes(io::RunRecorder& recorder) override {
    // Steps launched as one CUDA graph, and steps run eagerly after the capture (other shapes).
    recorder.set_attribute("cuda_graph_replays", static_cast<double>(graph_.replays()));
    recorder.set_attribute("cuda_graph_eager_steps",
                           static_cast<double>(graph_.eager_after_capture()));
  }

  void cancel_next() override {
    if (!ahead_) return;
    data_.set_position(before_ahead_);
    ahead_.reset();
  }

  void save(const std::string& dir, const model::TrainState& state) override {
    std::unique_ptr<compat::FusedAdamW> gathered;  // zero-1: the shards, unsharded
    save_replicated_checkpoint(ctx_, dir, *model_, reducer_.checkpoint_state(gathered), state);
  }

  EpochEval evaluate(int64_t epoch, const StopCheck& stop) override {
    // Averaged gradients keep the replicas bitwise equal; a difference is a sync bug, caught here
    // rather than as a quietly worse model.
    if (world_ > 1) {
      check_replicas(model_, ctx_.step_comm(), "at the end of epoch " + std::to_string(epoch + 1),
                     "the data-parallel replicas diverged: rerun with --grad-sync per-param or "
                     "--embedding-sync dense and report the run");
    }
    const int64_t vocab = ctx_.model_config.vocab_size;
    const auto logits_fn = [&](const torch::Tensor& ids) {
      compat::AutocastGuard autocast(ctx_.device, ctx_.autocast);
      return model_->forward(ids).to(torch::kFloat32);
    };
    const auto val =
        validation_loss(logits_fn, data_.dataset().split("validation"), cfg_.data.max_eval_pairs,
                        micro_, cfg_.optim.seq_len, data_.special(), vocab, ctx_.device,
                        world_ > 1 ? &ctx_.step_comm() : nullptr, stop);
    EpochEval out{val.loss, val.perplexity, std::nan(""), val.stopped};
    if (val.stopped) return out;
    const int rank = ctx_.topo.rank;
    if (rank == 0 && cfg_.output.translate_samples > 0) {
      const auto samples =
          translate(logits_fn, data_.dataset().split("test"), cfg_.output.translate_samples,
                    cfg_.optim.seq_len, data_.special(), vocab, ctx_.tokenizer, ctx_.device,
                    // rank 0 alone: its own signal (the loop then agrees on it)
                    [] { return StopSignals::received() != 0; });
      out.bleu = translations_bleu(samples);
      for (const auto& t : samples) {
        std::printf("  de: %s\n  en: %s\n  model: %s\n", t.source.c_str(), t.reference.c_str(),
                    t.hypothesis.c_str());
      }
    }
    if (rank == 0) {
      std::printf("epoch %lld: validation loss %.4f perplexity %.2f",
                  static_cast<long long>(epoch + 1), val.loss, val.perplexity);
      if (cfg_.output.translate_samples > 0) {
        std::printf(", BLEU (%d test pairs) %.2f", static_cast<int>(cfg_.output.translate_samples),
                    out.bleu);
      }
      std::printf("\n");
      std::fflush(stdout);
    }
    return out;
  }

 private:
  // A step's batch on the device and its loss rows.
  struct Prepared {
    TrainData::Step batch;
    DeviceBatch dev;
    std::vector<model::LossRows> rows;
    double host_seconds = 0;
  };

  Prepared prepare() {
    const auto t = Clock::now();
    Prepared p;
    p.batch = data_.next();
    p.dev = to_device(p.batch.batch, ctx_.device);
    // The head runs only where the loss counts; weights scaled so that averaging gradients over
    // `world` ranks gives the gradient of the global batch's mean (train/data.h).
    const double scale = static_cast<double>(world_) /
                         static_cast<double>(std::max<int64_t>(1, p.batch.global_target_tokens));
    p.rows = model::loss_rows(p.dev.labels, host_mask(p.batch.batch), cfg_.optim.grad_accum, scale,
                              positions_);
    p.host_seconds = since(t);
    return p;
  }

  const RunContext& ctx_;
  const parallel::TrainConfig& cfg_;
  TrainData& data_;
  model::GPT2 model_;
  GradReducer& reducer_;
  LossScaler& scaler_;
  const int world_;
  const int64_t micro_;
  const model::LossPositions positions_;
  compat::DeviceClock clock_;
  GraphedStep graph_;
  std::optional<Prepared> ahead_;
  data::SamplerPosition before_ahead_;  // where the data stood before ahead_ was taken from it
};

}  // namespace

int train_data_parallel(const parallel::TrainConfig& cfg_in, parallel::Program program,
                        const Topology& topo) {
  const char* name = program == parallel::Program::kSingle ? "gpt2_train" : "dp_train";
  const StopSignals signals;  // SIGTERM/SIGINT: checkpoint after the step, then exit
  auto ctx = make_run_context(cfg_in, program, topo);
  const auto& cfg = ctx.cfg;
  const int world = topo.size;
  const int rank = topo.rank;
  // make_run_context checked the mesh: one rank for gpt2_train, the batch divides over them.

  std::optional<TrainData> opened;
  open_train_data(ctx, rank, world, opened);
  TrainData& data = *opened;
  const int64_t micro = data.local_batch() / cfg.optim.grad_accum;
  GPT2P_CHECK(micro * cfg.optim.grad_accum == data.local_batch(),
              "per-rank batch " << data.local_batch() << " does not split into --grad-accum "
                                << cfg.optim.grad_accum << " micro-steps",
              "pick --grad-accum dividing --batch-size / ranks");

  torch::manual_seed(cfg.optim.seed + static_cast<uint64_t>(rank));  // dropout differs per rank
  auto model = make_model(ctx);
  if (world > 1) broadcast_parameters(model, ctx.step_comm());
  auto params = model->parameters();
  auto optimizer = make_adamw(cfg, params);

  model::TrainState state;
  if (!cfg.output.resume.empty()) {
    // Agreed before anything is written (see pp_trainer.cpp).
    cli::on_every_rank(
        [&] {
          state = model::load_checkpoint(cfg.output.resume, *model, optimizer.get(),
                                         {cfg.output.allow_unverified_checkpoint});
          check_resume_position(state, cfg, data.batches_per_epoch());
          check_resume_identity(state, cfg, data, rank);
          compat::set_rng_state(ctx.device, rank_rng_state(state, rank, world));
        },
        ctx.checkpoint_timeout());
    data.set_position({state.epoch, state.batch_in_epoch});
  }
  ReducerOptions ro;
  ro.kind = cfg.data_parallel.zero == 1                              ? ReducerKind::kSharded
            : world == 1                                             ? ReducerKind::kNone
            : cfg.data_parallel.grad_sync == GradSyncMode::kPerParam ? ReducerKind::kPerParam
                                                                     : ReducerKind::kBucketed;
  ro.group = ctx.comms.along(MeshDim::kDp);
  ro.bucket_mb = cfg.data_parallel.bucket_mb;
  ro.dtype =
      cfg.data_parallel.reduce_dtype == ReduceDtype::kBf16 ? torch::kBFloat16 : torch::kFloat32;
  if (cfg.data_parallel.embedding_sync == EmbeddingSync::kSparse)
    ro.sparse_tied = model->tied_parameter();
  const auto reducer = make_reducer(params, std::move(optimizer), ro);
  auto sink = reducer->embedding_sink();
  if (sink) model->set_embedding_grad_sink(std::move(sink));

  // A resumed run continues its rank files (the steps before the checkpoint stay recorded).
  io::RunRecorder recorder(
      cfg.output.out, run_identity(ctx, name),
      cfg.output.resume.empty() ? io::RecordMode::kCreate : io::RecordMode::kAppend);
  LossScaler scaler(cfg.loss_scale,
                    {state.loss_scale, state.loss_scale_good_steps, state.skipped_steps});
  DataParallelStep strategy(ctx, data, model, *reducer, scaler);
  if (rank == 0) {
    std::printf(
        "%s: %d rank(s) on %s, model %s, %lld training pairs, global batch %lld x %lld tokens, "
        "sync %s, %s, CUDA graphs %s\n",
        name, world, ctx.device.is_cuda() ? compat::device_name(ctx.device).c_str() : "cpu",
        model::describe(ctx.model_config).c_str(), static_cast<long long>(data.train_pairs()),
        static_cast<long long>(cfg.optim.batch_size), static_cast<long long>(cfg.optim.seq_len),
        reducer->name().c_str(), ctx.describe_kernels().c_str(),
        strategy.describe_graphs().c_str());
    if (ro.kind == ReducerKind::kSharded) {
      std::printf(
          "  ZeRO-1: AdamW state %.1f MiB per rank, sharded over %d ranks (%.1f MiB "
          "unsharded)\n",
          static_cast<double>(reducer->state_bytes()) / (1 << 20), world,
          static_cast<double>(reducer->unsharded_state_bytes()) / (1 << 20));
    }
    std::fflush(stdout);
  }
  recorder.set_attribute("zero", cfg.data_parallel.zero);
  // AdamW's two float32 moments per parameter this rank keeps (measured by the analysis).
  recorder.set_attribute("optimizer_state_bytes", static_cast<double>(reducer->state_bytes()));
  if (ctx.topo.rank == 0) write_run_config(cfg, program);
  return run_training(ctx, data, recorder, state,
                      {name, rank, world, static_cast<double>(world), &scaler}, strategy);
}

}  // namespace gpt2p::parallel
