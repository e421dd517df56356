#include "gpt2p/parallel/trainers/pipeline_step.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <optional>
#include <string>

#include "gpt2p/compat/cuda_graph.h"
#include "gpt2p/compat/device.h"
#include "gpt2p/model/flops.h"
#include "gpt2p/parallel/train/checkpoint_commit.h"
#include "gpt2p/parallel/train/common.h"
#include "gpt2p/parallel/train/evaluator.h"
#include "gpt2p/parallel/train/graphed_step.h"
#include "gpt2p/pipeline/plan/zero_bubble.h"

namespace gpt2p::parallel {
namespace {

// Validation loss through the pipeline, forward only: per batch, one run of `executor` (this
// rank's part of make_forward_only_schedule of one micro-batch, the micro-batch flowing stage to
// stage over the pipeline's transport; this rank's `stages` are rank + c * ranks). The last stage
// sums the masked CE and broadcasts (sum, count) over `pipe`; every rank returns the same value.
LossResult pipeline_validation_loss(
    const std::vector<std::unique_ptr<pipeline::GptEvalStage>>& stages,
    pipeline::Executor& executor, comm::Communicator& pipe, const data::Split& split,
    int64_t max_pairs, int64_t batch_size, int64_t seq_len, const data::SpecialTokens& special,
    const StopCheck& stop) {
  torch::NoGradGuard no_grad;
  const int n = pipe.size();
  const auto device = pipe.device();
  const int64_t total = max_pairs > 0 ? std::min(max_pairs, split.size()) : split.size();
  for (auto& stage : stages) stage->take_totals();  // drop a stopped evaluation's partial sums
  for (int64_t b = 0; b < total; b += batch_size) {
    // Every rank of every replica walks the same batches, so all ask `stop` in step.
    if (stop()) {
      LossResult r;
      r.stopped = true;
      r.loss = r.perplexity = std::numeric_limits<double>::quiet_NaN();
      return r;
    }
    std::vector<int64_t> idx;
    for (int64_t i = b; i < std::min(total, b + batch_size); ++i) idx.push_back(i);
    const auto dev = to_device(data::make_batch(split, idx, seq_len, special), device);
    pipeline::StageBatch batch;
    batch.inputs = dev.inputs;
    batch.labels = dev.labels;
    batch.mask = dev.mask;
    for (auto& stage : stages) stage->set_batch(batch);
    executor.run_step(b / batch_size, 0.0);
  }
  double sum = 0, count = 0;
  for (auto& stage : stages) {
    const auto t = stage->take_totals();
    sum += t.loss_sum;
    count += t.tokens;
  }
  auto totals =
      torch::tensor({sum, count}, torch::TensorOptions().dtype(torch::kFloat64)).to(device);
  if (n > 1) pipe.broadcast(totals, n - 1);
  totals = totals.cpu();
  LossResult r;
  r.tokens = static_cast<int64_t>(totals[1].item<double>());
  r.loss = r.tokens > 0 ? totals[0].item<double>() / totals[1].item<double>()
                        : std::numeric_limits<double>::quiet_NaN();
  r.perplexity = std::exp(r.loss);
  return r;
}

std::vector<GradReducer*> reducer_parts(const std::vector<std::unique_ptr<GradReducer>>& r) {
  std::vector<GradReducer*> parts;
  for (const auto& p : r) parts.push_back(p.get());
  return parts;
}

// One pipeline step: the executor runs this rank's part of the schedule over the batch's
// micro-batches, the tied embedding's gradient is summed between the first and the last stage,
// and every stage's optimizer steps. Each rank records its actions and the loss, which the last
// stage computes. Each stage's reducer (reducer.h) sums its gradients over the stage's replicas
// and holds its optimizer, sharded or not.
class PipelineStep final : public StepStrategy {
 public:
  PipelineStep(const RunContext& ctx, TrainData& data, PipelineStages parts, double loss_share,
               io::RunRecorder& recorder, LossScaler& scaler)
      : ctx_(ctx),
        cfg_(ctx.cfg),
        data_(data),
        recorder_(recorder),
        scaler_(scaler),
        split_(std::move(parts.split)),
        my_stages_(std::move(parts.mine)),
        models_(std::move(parts.models)),
        reducers_(make_reducers(std::move(parts.optimizers))),
        m_(ctx.cfg.pipeline.microbatches),
        positions_(ctx.cfg.compute.loss_positions),
        transport_(*channel(pipeline::Channel::kActivations),
                   *channel(pipeline::Channel::kGradients),
                   channel(pipeline::Channel::kActivationsWrap),
                   channel(pipeline::Channel::kGradientsWrap)),
        clock_(ctx.device, 3) {
    const bool graphed = pipeline_graph_blocker(ctx).empty();
    if (graphed) {
      stream_.emplace(ctx.device);  // a capture needs a stream other than the default
      graph_pool_ = std::make_shared<compat::GraphPool>();
    }
    std::vector<pipeline::Stage*> stage_ptrs;
    for (size_t c = 0; c < models_.size(); ++c) {
      stages_.push_back(std::make_unique<pipeline::GptStage>(
          models_[c], m_, ctx.autocast, positions_, cfg_.pipeline.zero_bubble));
      stage_ptrs.push_back(stages_.back().get());
      // The replicas' sum of each stage starts with its last backward (a no-op for the other
      // kinds).
      stages_[c]->set_last_backward_hook([r = reducers_[c].get()] { r->begin_backward(true); });
      if (graphed) stages_[c]->use_graphs(graph_pool_);
      // Without replicas nothing reads wte's .grad before the schedule ends.
      if (replicas() == nullptr) stages_[c]->sum_lookup_grads_per_step();
    }
    const int n = ctx.mesh.pp(), rank = ctx.mesh.pp_rank(), v = cfg_.pipeline.stages_per_rank;
    const auto& mc = ctx.model_config;
    const auto schedule =
        cfg_.pipeline.zero_bubble
            ? pipeline::make_zero_bubble_schedule(
                  cfg_.pipeline.schedule, m_, n, v,
                  pipeline::zero_bubble_costs(split_, static_cast<int>(mc.n_layer),
                                              static_cast<int>(mc.n_embd),
                                              static_cast<int>(cfg_.optim.seq_len),
                                              static_cast<int>(mc.padded_vocab_size()), loss_share),
                  cfg_.pipeline.zb_extra_live)
            : pipeline::make_schedule(cfg_.pipeline.schedule, m_, n, v);
    executor_ = std::make_unique<pipeline::Executor>(
        stage_ptrs, transport_, schedule[static_cast<size_t>(rank)], rank, n, ctx.device);
    // Evaluation: the same models forward only, one micro-batch per batch, over the same
    // transport.
    std::vector<pipeline::Stage*> eval_ptrs;
    for (const auto& model : models_) {
      eval_stages_.push_back(std::make_unique<pipeline::GptEvalStage>(model, 1, ctx.autocast));
      eval_ptrs.push_back(eval_stages_.back().get());
    }
    eval_executor_ = std::make_unique<pipeline::Executor>(
        eval_ptrs, transport_,
        pipeline::make_forward_only_schedule(1, n, v)[static_cast<size_t>(rank)], rank, n,
        ctx.device, pipeline::Pass::kForwardOnly);
    if (ctx.topo.rank == 0 && cfg_.data_parallel.zero == 1) {
      std::printf(
          "  ZeRO-1: stage 0's AdamW state %.1f MiB per rank, sharded over %d replicas "
          "(%.1f MiB unsharded)\n",
          static_cast<double>(reducers_.front()->state_bytes()) / (1 << 20), ctx.mesh.dp(),
          static_cast<double>(reducers_.front()->unsharded_state_bytes()) / (1 << 20));
      std::fflush(stdout);
    }
  }

  void set_training(bool training) override {
    for (auto& model : models_) training ? model->train() : model->eval();
  }

  void record_attributes(io::RunRecorder& recorder) override {
    // Steps whose micro-batches ran as CUDA graphs (captured, then replayed).
    recorder.set_attribute("cuda_graph_replays",
                           static_cast<double>(stages_.front()->graphed_steps()));
  }

  double step(io::StepRecord& rec, bool /*more*/) override {
    const int n = ctx_.mesh.pp(), rank = ctx_.mesh.pp_rank();
    const auto t0 = Clock::now();
    auto batch = data_.next();
    auto dev = to_device(batch.batch, ctx_.device);
    const double scale = scaler_.scale();
    for (auto& stage : stages_) {
      stage->set_batch({dev.inputs, dev.labels, dev.mask, batch.global_target_tokens,
                        host_mask(batch.batch), scale});
    }
    rec.data = since(t0);
    // The weights are cast to bf16/fp16 once for all micro-batches, not once per micro-batch.
    const auto times = [&] {
      compat::AutocastCacheScope casts;
      return executor_->run_step(rec.step, rec.start + rec.data);
    }();
    clock_.mark(0);
    // Each stage's gradients summed over its replicas (each replica's loss is its share of the
    // global batch's mean; started by the stage's last backward), then the tied weight's two
    // halves within each pipeline.
    for (auto* r : parts_) r->finish_grad_sync();
    sum_tied_gradient(parts_, models_, *pipe());
    clock_.mark(1);
    // The gradients are unscaled while clipped; with loss scaling every rank agrees to skip a step
    // whose gradients overflowed anywhere.
    bool apply = true;
    if (cfg_.optim.grad_clip > 0 || scaler_.enabled()) {
      if (scaler_.injects_fault(ctx_.topo.rank, rec.step)) {
        // GPT2P_INJECT_NONFINITE_GRADS (loss_scaler.h): this rank's summed gradients become NaN.
        const auto nan = torch::full({}, std::nan(""), torch::TensorOptions().device(ctx_.device));
        for (auto* r : parts_) r->scale_grads(nan);
      }
      // Clipped (at --grad-clip; 0: not) and unscaled over every stage of every rank.
      const double norm = clip_pipeline_grad_norm(parts_, models_, *pipe(), *ctx_.control,
                                                  cfg_.optim.grad_clip, 1 / scale);
      if (scaler_.enabled()) {
        apply = scaler_.update(std::isfinite(norm), ctx_.control.get(), rec.step);
      }
    }
    if (apply) {
      for (auto* r : parts_) r->step();
      for (auto* r : parts_) r->wait_params();
    }
    rec.loss_scale = scale;
    rec.skipped = apply ? 0 : 1;
    // Graphed stages add into .grad where their capture found it.
    for (auto* r : parts_) graph_pool_ ? r->zero_grad_in_place() : r->zero_grad();
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
    if (n > 1) pipe()->broadcast(loss, n - 1);
    if (replicas() != nullptr) replicas()->all_reduce(loss, comm::ReduceOp::kSum);
    rec.loss = loss.item<double>();
    rec.padded_tokens = batch.batch.padded_tokens;
    rec.target_tokens = batch.batch.target_tokens;
    rec.lr = cfg_.optim.lr;
    // Model FLOPs: this rank's stages, and the whole model's for the progress line.
    const int64_t head_rows =
        positions_ == model::LossPositions::kAll ? rec.padded_tokens : rec.target_tokens;
    rec.flops = 0;
    for (const int s : my_stages_) {
      const auto r = split_[static_cast<size_t>(s)];
      rec.flops += model::training_flops(ctx_.model_config, r.begin, r.end, rec.padded_tokens,
                                         cfg_.optim.seq_len, head_rows);
    }
    // Every replica's tokens: the data's share of each is the same size.
    return ctx_.mesh.dp() * model::training_flops(ctx_.model_config, 0,
                                                  ctx_.model_config.num_stage_layers(),
                                                  rec.padded_tokens, cfg_.optim.seq_len, head_rows);
  }

  void save(const std::string& dir, const model::TrainState& state) override {
    std::vector<StagePart> parts;
    // --zero 1: the unsharded states, gathered stage by stage (collective over the replicas).
    std::vector<std::unique_ptr<compat::FusedAdamW>> gathered(models_.size());
    for (size_t c = 0; c < models_.size(); ++c) {
      parts.push_back(
          {my_stages_[c], models_[c].get(), &reducers_[c]->checkpoint_state(gathered[c])});
    }
    save_stage_checkpoints(ctx_, dir, parts, static_cast<int>(split_.size()), state);
  }

  EpochEval evaluate(int64_t epoch, const StopCheck& stop) override {
    // The replicas' summed gradients keep each stage bitwise equal across them, as in dp_train.
    if (replicas() != nullptr) {
      for (auto& model : models_) {
        check_replicas(model, *replicas(), "at the end of epoch " + std::to_string(epoch + 1),
                       "the pipeline's replicas diverged: report the run with its flags");
      }
    }
    const auto val = pipeline_validation_loss(eval_stages_, *eval_executor_, *pipe(),
                                              data_.dataset().split("validation"),
                                              cfg_.data.max_eval_pairs, data_.local_batch() / m_,
                                              cfg_.optim.seq_len, data_.special(), stop);
    if (val.stopped) return {val.loss, val.perplexity, std::nan(""), true};
    if (ctx_.topo.rank == 0) {
      std::printf("epoch %lld: validation loss %.4f perplexity %.2f\n",
                  static_cast<long long>(epoch + 1), val.loss, val.perplexity);
      std::fflush(stdout);
    }
    return {val.loss, val.perplexity, std::nan("")};
  }

 private:
  // This rank's pipeline, and its stages' replicas (null with --dp 1).
  comm::Communicator* pipe() const { return ctx_.comms.along(MeshDim::kPp); }
  comm::Communicator* replicas() const { return ctx_.comms.along(MeshDim::kDp); }
  comm::Communicator* channel(pipeline::Channel c) const {
    return ctx_.comms.along(MeshDim::kPp, static_cast<int>(c));
  }

  // Each stage's reducer over its replicas (none with --dp 1): the replicas' sum, or with --zero 1
  // the stage's AdamW state sharded over them (a resumed state is sharded, the whole copy
  // dropped; the tied weight gets a bucket of its own, so the first and the last stage shard it
  // alike).
  std::vector<std::unique_ptr<GradReducer>> make_reducers(
      std::vector<std::unique_ptr<compat::FusedAdamW>> optimizers) const {
    std::vector<std::unique_ptr<GradReducer>> reducers;
    for (size_t c = 0; c < models_.size(); ++c) {
      ReducerOptions ro;
      ro.kind = replicas() == nullptr          ? ReducerKind::kNone
                : cfg_.data_parallel.zero == 1 ? ReducerKind::kSharded
                                               : ReducerKind::kBucketed;
      ro.group = replicas();
      ro.op = comm::ReduceOp::kSum;
      ro.overlap = false;
      ro.bucket_mb = cfg_.data_parallel.bucket_mb;
      if (ro.kind == ReducerKind::kSharded) ro.alone = models_[c]->tied_parameter();
      reducers.push_back(make_reducer(models_[c]->parameters(), std::move(optimizers[c]), ro));
    }
    return reducers;
  }

  const RunContext& ctx_;
  const parallel::TrainConfig& cfg_;
  TrainData& data_;
  io::RunRecorder& recorder_;
  LossScaler& scaler_;
  const pipeline::Partition split_;
  const std::vector<int> my_stages_;
  std::vector<model::GPT2> models_;
  std::vector<std::unique_ptr<GradReducer>> reducers_;  // per stage
  std::vector<GradReducer*> parts_ = reducer_parts(reducers_);
  const int m_;
  const model::LossPositions positions_;
  std::vector<std::unique_ptr<pipeline::GptStage>> stages_;
  pipeline::CommTransport transport_;
  std::unique_ptr<pipeline::Executor> executor_;
  // Evaluation's stages over models_ and its forward-only executor.
  std::vector<std::unique_ptr<pipeline::GptEvalStage>> eval_stages_;
  std::unique_ptr<pipeline::Executor> eval_executor_;
  compat::DeviceClock clock_;
  // --cuda-graphs: the training stream and the pool every stage's graphs share (null: eager).
  std::optional<compat::TrainingStream> stream_;
  std::shared_ptr<compat::GraphPool> graph_pool_;
};

}  // namespace

std::string pipeline_graph_blocker(const RunContext& ctx) {
  return pipeline::graph_blocker(pipeline_graph_terms(ctx.cfg, ctx.device, ctx.mesh.dp()));
}

pipeline::GraphTerms pipeline_graph_terms(const TrainConfig& cfg, const torch::Device& device,
                                          int replicas) {
  pipeline::GraphTerms terms = graph_terms(cfg, device);
  terms.zero_bubble = cfg.pipeline.zero_bubble;
  terms.replicas = replicas;
  return terms;
}

std::unique_ptr<StepStrategy> make_pipeline_step(const RunContext& ctx, TrainData& data,
                                                 PipelineStages stages, double loss_share,
                                                 io::RunRecorder& recorder, LossScaler& scaler) {
  return std::make_unique<PipelineStep>(ctx, data, std::move(stages), loss_share, recorder, scaler);
}

}  // namespace gpt2p::parallel
