#include "gpt2p/parallel/pp_trainer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
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
#include "gpt2p/parallel/checkpoint_commit.h"
#include "gpt2p/parallel/evaluator.h"
#include "gpt2p/parallel/run_context.h"
#include "gpt2p/parallel/stage_split.h"
#include "gpt2p/parallel/train_common.h"
#include "gpt2p/parallel/train_data.h"
#include "gpt2p/parallel/training_loop.h"
#include "gpt2p/parallel/pipeline_grads.h"
#include "gpt2p/parallel/zero.h"
#include "gpt2p/pipeline/runtime/executor.h"
#include "gpt2p/pipeline/plan/zero_bubble.h"

namespace gpt2p::parallel {
namespace {

// Validation loss through the pipeline, forward only: micro-batches flow stage to stage (this
// rank's `stages` are rank + c * ranks), the last stage sums the masked CE and broadcasts
// (sum, count); every rank returns the same value.
LossResult pipeline_validation_loss(const std::vector<model::GPT2>& stages,
                                    comm::Communicator& comm, const data::Split& split,
                                    int64_t max_pairs, int64_t batch_size, int64_t seq_len,
                                    const data::SpecialTokens& special, bool bf16) {
  torch::NoGradGuard no_grad;
  const int n = comm.size(), rank = comm.rank();
  const int n_stages = n * static_cast<int>(stages.size());
  const auto device = comm.device();
  const int64_t total = max_pairs > 0 ? std::min(max_pairs, split.size()) : split.size();
  double sum = 0, count = 0;
  for (int64_t b = 0; b < total; b += batch_size) {
    std::vector<int64_t> idx;
    for (int64_t i = b; i < std::min(total, b + batch_size); ++i) idx.push_back(i);
    const auto dev = to_device(data::make_batch(split, idx, seq_len, special), device);
    for (size_t c = 0; c < stages.size(); ++c) {
      auto model = stages[c];  // a handle: forward() is not const
      const int s = rank + static_cast<int>(c) * n;
      torch::Tensor x = dev.inputs;
      if (s > 0) {
        x = torch::empty({dev.inputs.size(0), seq_len, model->config().n_embd},
                         torch::TensorOptions().dtype(torch::kFloat32).device(device));
        comm.recv(x, pipeline::rank_of_stage(s - 1, n));
      }
      torch::Tensor y;
      {
        compat::AutocastGuard autocast(device, bf16);
        y = model->forward(x).to(torch::kFloat32);
      }
      if (s + 1 < n_stages) {
        comm.send(y, pipeline::rank_of_stage(s + 1, n));
      } else {
        const double tokens = dev.mask.sum().item<double>();
        if (tokens == 0) continue;
        sum += model->lm_loss(y, dev.labels, dev.mask).item<double>() * tokens;
        count += tokens;
      }
    }
  }
  auto totals =
      torch::tensor({sum, count}, torch::TensorOptions().dtype(torch::kFloat64)).to(device);
  if (n > 1) comm.broadcast(totals, n - 1);
  totals = totals.cpu();
  LossResult r;
  r.tokens = static_cast<int64_t>(totals[1].item<double>());
  r.loss = r.tokens > 0 ? totals[0].item<double>() / totals[1].item<double>()
                        : std::numeric_limits<double>::quiet_NaN();
  r.perplexity = std::exp(r.loss);
  return r;
}

// Replica 0's measured layer costs on every replica (float64 over `dp_comm`'s device).
std::vector<double> broadcast_costs(comm::Communicator& dp_comm, const std::vector<double>& costs) {
  auto t = torch::tensor(costs, torch::TensorOptions().dtype(torch::kFloat64)).to(dp_comm.device());
  dp_comm.broadcast(t, 0);
  t = t.cpu().contiguous();
  return {t.data_ptr<double>(), t.data_ptr<double>() + t.numel()};
}

}  // namespace

namespace {

// One pipeline step: the executor runs this rank's part of the schedule over the batch's
// micro-batches, the tied embedding's gradient is summed between the first and the last stage,
// and every stage's optimizer steps. Each rank records its actions and the loss, which the last
// stage computes. With --zero 1 each stage's `zero` shards replace the replicas' sum and the
// optimizers (zero.h).
class PipelineStep final : public StepStrategy {
 public:
  PipelineStep(const RunContext& ctx, TrainData& data, io::RunRecorder& recorder,
               std::vector<model::GPT2>& models,
               std::vector<std::unique_ptr<compat::FusedAdamW>>& optimizers,
               std::vector<std::unique_ptr<ShardedAdamW>>& zero, ReplicaGradSync* replica_sum,
               std::vector<std::unique_ptr<pipeline::GptStage>>& stages,
               pipeline::Executor& executor, const std::vector<int>& my_stages,
               const pipeline::Partition& split, int microbatches, bool bf16,
               model::LossPositions positions)
      : ctx_(ctx),
        cfg_(ctx.cfg),
        data_(data),
        recorder_(recorder),
        models_(models),
        optimizers_(optimizers),
        zero_(zero),
        replica_sum_(replica_sum),
        stages_(stages),
        executor_(executor),
        my_stages_(my_stages),
        split_(split),
        m_(microbatches),
        bf16_(bf16),
        positions_(positions),
        clock_(ctx.device, 3) {}

  void set_training(bool training) override {
    for (auto& model : models_) training ? model->train() : model->eval();
  }

  double step(io::StepRecord& rec, bool /*more*/) override {
    const int n = ctx_.mesh.pp, rank = ctx_.mesh.pp_rank;
    const auto t0 = Clock::now();
    auto batch = data_.next();
    auto dev = to_device(batch.batch, ctx_.device);
    for (auto& stage : stages_) {
      stage->set_batch({dev.inputs, dev.labels, dev.mask, batch.global_target_tokens,
                        host_mask(batch.batch)});
    }
    rec.data = since(t0);
    const auto times = executor_.run_step(rec.step, rec.start + rec.data);
    clock_.mark(0);
    if (zero_.empty()) {
      // Each stage's gradient summed over its replicas (each replica's loss is its share of the
      // global batch's mean; started by the stage's last backward), then the tied weight's two
      // halves within each pipeline.
      if (replica_sum_ != nullptr) replica_sum_->finish();
      parallel::sync_tied_gradient(models_, *ctx_.comm);
    } else {
      // Each stage's shards over its replicas, then the tied weight's two halves within each
      // pipeline, shard to shard: the first and the last stage shard it alike (bucketed alone), so
      // a + b == b + a keeps their copies identical whatever order the reductions added in.
      std::vector<torch::Tensor> tied;
      for (size_t c = 0; c < zero_.size(); ++c) {
        zero_[c]->reduce_now();
        const bool ends = models_[c]->has_embedding() || models_[c]->has_head();
        tied.push_back(ends && !models_[c]->is_full() ? zero_[c]->alone_shard_grad()
                                                      : torch::Tensor());
      }
      parallel::sync_tied_gradient(models_, *ctx_.comm, tied);
    }
    clock_.mark(1);
    if (zero_.empty()) {
      if (cfg_.grad_clip > 0) parallel::clip_grad_norm_pipeline(models_, ctx_.comm.get(), cfg_.grad_clip);
      for (size_t c = 0; c < models_.size(); ++c) optimizers_[c]->step();
    } else {
      if (cfg_.grad_clip > 0) {
        std::vector<ShardedAdamW*> shards;
        std::vector<torch::Tensor> uncounted;  // the head's copy of the tied weight
        for (size_t c = 0; c < models_.size(); ++c) {
          shards.push_back(zero_[c].get());
          uncounted.push_back(models_[c]->has_embedding() ? torch::Tensor()
                                                          : models_[c]->tied_parameter());
        }
        // One all-reduce over every rank: each gets the same factor, the two copies of the tied
        // weight included.
        clip_sharded_grad_norm(shards, uncounted, {ctx_.control.get()}, cfg_.grad_clip);
      }
      for (auto& z : zero_) z->step();
      for (auto& z : zero_) z->wait_params();
    }
    for (auto& model : models_) {
      for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();
    }
    clock_.mark(2);
    // The optimizer's action ends now, on the run's clock (rec.start counts from its start).
    const double opt_end = rec.start + since(t0);
    for (const auto& a : times.actions) recorder_.action(a);
    rec.forward = times.forward;
    rec.backward = times.backward;
    rec.sync_exposed = times.comm_wait + clock_.elapsed(0, 1);
    rec.sync_total = rec.sync_exposed;
    rec.optimizer = clock_.elapsed(1, 2);
    recorder_.action({rec.step, rank, static_cast<int>(io::ActionOp::kOptimizer), -1,
                      opt_end - rec.optimizer, opt_end, 0, 0});
    // The loss lives on the last stage; every rank records it.
    double loss_sum = 0;
    for (auto& stage : stages_) loss_sum += stage->take_loss();
    auto loss =
        torch::tensor({loss_sum}, torch::TensorOptions().dtype(torch::kFloat64)).to(ctx_.device);
    if (n > 1) ctx_.comm->broadcast(loss, n - 1);
    if (ctx_.dp_comm) ctx_.dp_comm->all_reduce(loss, comm::ReduceOp::kSum);
    rec.loss = loss.item<double>();
    rec.padded_tokens = batch.batch.padded_tokens;
    rec.target_tokens = batch.batch.target_tokens;
    rec.lr = cfg_.lr;
    // Model FLOPs: this rank's stages, and the whole model's for the progress line.
    const int64_t head_rows =
        positions_ == model::LossPositions::kAll ? rec.padded_tokens : rec.target_tokens;
    rec.flops = 0;
    for (const int s : my_stages_) {
      const auto r = split_[static_cast<size_t>(s)];
      rec.flops += model::training_flops(ctx_.model_config, r.begin, r.end, rec.padded_tokens,
                                         cfg_.seq_len, head_rows);
    }
    // Every replica's tokens: the data's share of each is the same size.
    return ctx_.mesh.dp * model::training_flops(ctx_.model_config, 0,
                                                ctx_.model_config.num_stage_layers(),
                                                rec.padded_tokens, cfg_.seq_len, head_rows);
  }

  void save(const std::string& dir, const model::TrainState& state) override {
    std::vector<StagePart> parts;
    std::vector<std::unique_ptr<compat::FusedAdamW>> gathered;  // --zero 1: unsharded states
    for (size_t c = 0; c < models_.size(); ++c) {
      const torch::optim::Optimizer* optimizer = optimizers_[c].get();
      if (!zero_.empty()) {
        gathered.push_back(zero_[c]->full_state());
        optimizer = gathered.back().get();
      }
      parts.push_back({my_stages_[c], models_[c].get(), optimizer});
    }
    save_stage_checkpoints(ctx_, dir, parts, static_cast<int>(split_.size()), state);
  }

  EpochEval evaluate(int64_t epoch) override {
    const auto val = pipeline_validation_loss(models_, *ctx_.comm,
                                              data_.dataset().split("validation"),
                                              cfg_.max_eval_pairs, data_.local_batch() / m_,
                                              cfg_.seq_len, data_.special(), bf16_);
    if (ctx_.topo.rank == 0) {
      std::printf("epoch %lld: validation loss %.4f perplexity %.2f\n",
                  static_cast<long long>(epoch + 1), val.loss, val.perplexity);
      std::fflush(stdout);
    }
    return {val.loss, val.perplexity, std::nan("")};
  }

 private:
  const RunContext& ctx_;
  const parallel::TrainConfig& cfg_;
  TrainData& data_;
  io::RunRecorder& recorder_;
  std::vector<model::GPT2>& models_;
  std::vector<std::unique_ptr<compat::FusedAdamW>>& optimizers_;
  std::vector<std::unique_ptr<ShardedAdamW>>& zero_;
  ReplicaGradSync* replica_sum_;  // null with one replica or with ZeRO
  std::vector<std::unique_ptr<pipeline::GptStage>>& stages_;
  pipeline::Executor& executor_;
  const std::vector<int>& my_stages_;
  const pipeline::Partition& split_;
  const int m_;
  const bool bf16_;
  const model::LossPositions positions_;
  compat::DeviceClock clock_;
};

}  // namespace

int train_pipeline(const parallel::TrainConfig& cfg_in, const Topology& topo) {
  const StopSignals signals;  // SIGTERM/SIGINT: checkpoint after the step, then exit
  auto ctx = make_run_context(cfg_in, parallel::Program::kPipeline, topo);
  const auto& cfg = ctx.cfg;
  // This rank's pipeline: n ranks, of which it is `rank` (the world with --dp 1; mesh.h).
  const int n = ctx.mesh.pp, rank = ctx.mesh.pp_rank;
  const int m = cfg.mode == PipelineMode::kModelParallel ? 1 : cfg.microbatches;
  const bool bf16 = cfg.precision == model::Precision::kBf16;
  if (cfg.zero == 1 && ctx.mesh.dp < 2) {
    throw cli::UsageError("pp_train --zero 1 shards each stage's optimizer state over its "
                          "data-parallel replicas, but --dp is " + std::to_string(ctx.mesh.dp) +
                          " -- fix: pass --dp 2 or more (mpirun -np D*P pp_train --dp D), or drop "
                          "--zero 1");
  }
  const int v = cfg.stages_per_rank;  // this rank runs stages rank, rank + n, ...
  const int n_stages = n * v;
  GPT2P_CHECK(v == 1 || n >= 2,
              "--schedule interleaved on " << n << " rank: nothing to interleave with",
              "start 2 or more ranks, or use --schedule 1f1b on one rank");
  GPT2P_CHECK(v == 1 || m % n == 0,
              "--microbatches " << m << " is not a multiple of the " << n
                                << " ranks, as --schedule interleaved needs",
              "pick --microbatches from " << n << ", " << 2 * n << ", " << 4 * n << ", ...");
  // A pipeline's ranks all see their replica's batch: replica d is data rank d of D (with --dp 1
  // the global batch, a data "world" of one).
  std::optional<TrainData> opened;
  open_train_data(ctx, ctx.mesh.dp_rank, ctx.mesh.dp, opened);
  TrainData& data = *opened;
  const auto positions = cfg.loss_positions;
  // The head's cost depends on how many positions it runs at: the data's share of targets.
  const double loss_share =
      positions == model::LossPositions::kTargets ? data.target_fraction() : 1.0;
  std::vector<double> costs;
  if (cfg.partition == pipeline::PartitionKind::kMeasured && cfg.resume.empty()) {
    costs = measured_layer_costs(*ctx.comm, ctx.model_config, data.local_batch() / m,
                                 cfg.seq_len, bf16, loss_share);
    // Every replica splits as replica 0 measured, or their stages would differ.
    if (ctx.dp_comm) costs = broadcast_costs(*ctx.dp_comm, costs);
    compat::reset_peak_memory(ctx.device);
  }
  pipeline::Partition split;  // agreed: a checkpoint every rank rejects is reported once
  cli::on_every_rank(
      [&] {
        split = cfg.resume.empty() ? stage_partition(cfg.partition, ctx.model_config, n_stages,
                                                     cfg.seq_len, costs, v, loss_share)
                                   : checkpoint_partition(cfg.resume, n_stages, ctx.mesh.dp);
      },
      ctx.checkpoint_timeout());
  GPT2P_CHECK(cfg.grad_accum == 1, "pp_train does not take --grad-accum " << cfg.grad_accum,
              "use --microbatches: the pipeline accumulates over its micro-batches");
  const auto kind = cfg.schedule;

  torch::manual_seed(cfg.seed + static_cast<uint64_t>(rank));
  // This rank's stages, each with its own optimizer and checkpoint directory.
  std::vector<int> my_stages;
  std::vector<model::GPT2> models;
  std::vector<std::unique_ptr<compat::FusedAdamW>> optimizers;
  for (int c = 0; c < v; ++c) {
    const int s = rank + c * n;
    const auto range = split[static_cast<size_t>(s)];
    model::GPT2 model(ctx.model_config, range);
    model->reset_parameters(cfg.seed);
    if (!cfg.init_from.empty()) {
      cli::on_every_rank([&] { init_from(model, cfg.init_from); }, ctx.checkpoint_timeout());
    }
    model->to(ctx.device);
    model->set_kernels(ctx.kernels);
    model->set_recompute(cfg.recompute);
    optimizers.push_back(std::make_unique<compat::FusedAdamW>(
        model->parameters(), torch::optim::AdamWOptions(cfg.lr).weight_decay(cfg.weight_decay)));
    my_stages.push_back(s);
    models.push_back(model);
  }
  model::TrainState state;
  if (!cfg.resume.empty()) {
    // Agreed before anything is written: a stage that cannot be read ends the job on every rank
    // while the run's files are as they were.
    cli::on_every_rank(
        [&] {
          for (int c = 0; c < v; ++c) {
            const std::string dir =
                cfg.resume + "/stage" + std::to_string(my_stages[static_cast<size_t>(c)]);
            auto st = model::load_checkpoint(dir, *models[static_cast<size_t>(c)],
                                             optimizers[static_cast<size_t>(c)].get());
            if (c == 0) state = st;
          }
          compat::set_rng_state(ctx.device,
                                ctx.mesh.dp > 1
                                    ? rank_rng_state(state, ctx.mesh.dp_rank, ctx.mesh.dp)
                                    : state.rng_state);
        },
        ctx.checkpoint_timeout());
    data.set_position({state.epoch, state.batch_in_epoch});
  }

  // --zero 1: each stage's AdamW state sharded over its replicas; a resumed state is sharded and
  // the whole copy dropped.
  std::vector<std::unique_ptr<ShardedAdamW>> zero;
  if (cfg.zero == 1) {
    for (size_t c = 0; c < models.size(); ++c) {
      ZeroOptions zo;
      zo.adam = torch::optim::AdamWOptions(cfg.lr).weight_decay(cfg.weight_decay);
      zo.buckets.bucket_mb = cfg.bucket_mb;
      zo.op = comm::ReduceOp::kSum;
      zo.overlap = false;
      zo.buckets.alone = models[c]->tied_parameter();
      zero.push_back(std::make_unique<ShardedAdamW>(models[c]->parameters(), *ctx.dp_comm, zo));
      if (!cfg.resume.empty()) zero.back()->load_state(*optimizers[c]);
      optimizers[c]->state().clear();
    }
  }

  std::vector<std::unique_ptr<pipeline::GptStage>> stages;
  std::vector<pipeline::Stage*> stage_ptrs;
  for (auto& model : models) {
    stages.push_back(std::make_unique<pipeline::GptStage>(model, m, bf16, positions,
                                                          cfg.zero_bubble));
    stage_ptrs.push_back(stages.back().get());
  }
  // The replicas' sum, each stage's started by its last backward (without ZeRO, whose
  // reduce-scatter follows the tied weight's exchange instead).
  std::unique_ptr<ReplicaGradSync> replica_sum;
  if (ctx.dp_comm && zero.empty()) {
    replica_sum = std::make_unique<ReplicaGradSync>(models, *ctx.dp_comm, cfg.bucket_mb);
    for (size_t c = 0; c < stages.size(); ++c) {
      stages[c]->set_last_backward_hook([sum = replica_sum.get(), c] { sum->arm(c); });
    }
  }
  pipeline::CommTransport transport(*ctx.comm, *ctx.grad_comm, ctx.act_wrap_comm.get(),
                                    ctx.grad_wrap_comm.get());
  const auto schedule =
      cfg.zero_bubble
          ? pipeline::make_zero_bubble_schedule(
                kind, m, n, v,
                pipeline::zero_bubble_costs(split, static_cast<int>(ctx.model_config.n_layer),
                                            static_cast<int>(ctx.model_config.n_embd),
                                            static_cast<int>(cfg.seq_len),
                                            static_cast<int>(ctx.model_config.padded_vocab_size()),
                                            loss_share),
                cfg.zb_extra_live)
          : pipeline::make_schedule(kind, m, n, v);
  pipeline::Executor executor(stage_ptrs, transport, schedule[static_cast<size_t>(rank)], rank, n,
                              ctx.device);
  // A resumed run continues its rank files (the steps before the checkpoint stay recorded).
  io::RunRecorder recorder(cfg.out, run_identity(ctx, "pp_train"),
                           cfg.resume.empty() ? io::RecordMode::kCreate : io::RecordMode::kAppend);
  recorder.set_attribute("stage", rank);
  recorder.set_attribute("dp", ctx.mesh.dp);
  recorder.set_attribute("dp_rank", ctx.mesh.dp_rank);
  recorder.set_attribute("pp", ctx.mesh.pp);
  recorder.set_attribute("pp_rank", ctx.mesh.pp_rank);
  // The layers of stage rank (layer_begin, layer_end) and of its further stages rank + c n
  // (layer_begin_<c>, layer_end_<c>).
  for (int c = 0; c < v; ++c) {
    const auto r = split[static_cast<size_t>(my_stages[static_cast<size_t>(c)])];
    const std::string suffix = c == 0 ? "" : "_" + std::to_string(c);
    recorder.set_attribute("layer_begin" + suffix, r.begin);
    recorder.set_attribute("layer_end" + suffix, r.end);
  }
  recorder.set_attribute("stages_per_rank", v);
  recorder.set_attribute("microbatches", m);
  if (!costs.empty()) {
    recorder.set_attribute("layer_time_embedding_s", costs.front());
    recorder.set_attribute("layer_time_block_s", costs[1]);
    recorder.set_attribute("layer_time_head_s", costs.back());
  }
  if (topo.rank == 0) {
    const std::string replicas =
        ctx.mesh.dp > 1 ? std::to_string(ctx.mesh.dp) + " replicas of " : std::string();
    std::printf(
        "pp_train: %s%d rank(s) x %d stage(s) on %s, model %s, %s, schedule %s, "
        "%d micro-batch(es), global batch %lld x %lld tokens\n"
        "  %s split (layers, inclusive): %s\n"
        "  loss at %s positions (the data's targets: %.3f of positions), %s\n",
        replicas.c_str(), n, v, ctx.device.is_cuda() ? compat::device_name(ctx.device).c_str() : "cpu",
        model::describe(ctx.model_config).c_str(), name_string(cfg.mode).c_str(),
        name_string(cfg.schedule).c_str(), m,
        static_cast<long long>(cfg.batch_size), static_cast<long long>(cfg.seq_len),
        cfg.resume.empty() ? name_string(cfg.partition).c_str() : "checkpoint's",
        pipeline::to_string(split).c_str(), name_string(cfg.loss_positions).c_str(),
        data.target_fraction(),
        ctx.describe_kernels().c_str());
    if (!costs.empty()) {
      std::printf("  measured ms per micro-batch (fwd+bwd): embedding %.3f, block %.3f, head %.3f"
                  " (= %.2f blocks)\n",
                  1e3 * costs.front(), 1e3 * costs[1], 1e3 * costs.back(),
                  costs[1] > 0 ? costs.back() / costs[1] : 0.0);
    }
    std::fflush(stdout);
  }

  recorder.set_attribute("zero", cfg.zero);
  if (topo.rank == 0 && !zero.empty()) {
    std::printf("  ZeRO-1: stage 0's AdamW state %.1f MiB per rank, sharded over %d replicas "
                "(%.1f MiB unsharded)\n",
                static_cast<double>(zero.front()->state_bytes()) / (1 << 20), ctx.mesh.dp,
                static_cast<double>(zero.front()->unsharded_state_bytes()) / (1 << 20));
    std::fflush(stdout);
  }
  PipelineStep strategy(ctx, data, recorder, models, optimizers, zero, replica_sum.get(), stages,
                        executor, my_stages, split, m, bf16, positions);
  return run_training(ctx, data, recorder, state,
                      {"pp_train", topo.rank, topo.size, static_cast<double>(ctx.mesh.dp)},
                      strategy);
}

}  // namespace gpt2p::parallel
