#include "gpt2p/parallel/trainers/pp_trainer.h"

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
#include "gpt2p/parallel/data_parallel/reducer.h"
#include "gpt2p/parallel/train/checkpoint_commit.h"
#include "gpt2p/parallel/train/common.h"
#include "gpt2p/parallel/train/context.h"
#include "gpt2p/parallel/train/data.h"
#include "gpt2p/parallel/train/evaluator.h"
#include "gpt2p/parallel/train/flags.h"
#include "gpt2p/parallel/train/loop.h"
#include "gpt2p/parallel/trainers/pipeline_step.h"
#include "gpt2p/parallel/trainers/stage_split.h"

namespace gpt2p::parallel {
namespace {

// Replica 0's measured layer costs on every replica (float64 over `dp_comm`'s device).
std::vector<double> broadcast_costs(comm::Communicator& dp_comm, const std::vector<double>& costs) {
  auto t = torch::tensor(costs, torch::TensorOptions().dtype(torch::kFloat64)).to(dp_comm.device());
  dp_comm.broadcast(t, 0);
  t = t.cpu().contiguous();
  return {t.data_ptr<double>(), t.data_ptr<double>() + t.numel()};
}

// This rank's stages of `split` (rank, rank + P, ...: mesh.h), each a model with its AdamW;
// dropout's generator is seeded per rank.
PipelineStages make_stages(const RunContext& ctx, pipeline::Partition split) {
  const int n = ctx.mesh.pp(), rank = ctx.mesh.pp_rank();
  torch::manual_seed(ctx.cfg.optim.seed + static_cast<uint64_t>(rank));
  PipelineStages stages;
  stages.split = std::move(split);
  for (int c = 0; c < ctx.cfg.pipeline.stages_per_rank; ++c) {
    const int s = rank + c * n;
    auto model = make_model(ctx, stages.split[static_cast<size_t>(s)]);
    stages.optimizers.push_back(make_adamw(ctx.cfg, model->parameters()));
    stages.mine.push_back(s);
    stages.models.push_back(model);
  }
  return stages;
}

// Loads every stage of this rank from --resume, restores its generator and puts the data at the
// checkpoint's position; returns the first stage's state. Agreed before anything is written: a
// stage that cannot be read ends the job on every rank while the run's files are as they were.
model::TrainState resume_stages(const RunContext& ctx, TrainData& data, PipelineStages& stages) {
  const auto& cfg = ctx.cfg;
  model::TrainState state;
  cli::on_every_rank(
      [&] {
        for (size_t c = 0; c < stages.models.size(); ++c) {
          const std::string dir = cfg.output.resume + "/stage" + std::to_string(stages.mine[c]);
          auto st = model::load_checkpoint(dir, *stages.models[c], stages.optimizers[c].get(),
                                           {cfg.output.allow_unverified_checkpoint});
          if (c == 0) state = st;
          check_resume_position(st, cfg, data.batches_per_epoch());
          if (c == 0) check_resume_identity(st, cfg, data, ctx.topo.rank);
        }
        compat::set_rng_state(
            ctx.device, ctx.mesh.dp() > 1 ? rank_rng_state(state, ctx.mesh.dp_rank(), ctx.mesh.dp())
                                          : state.rng_state);
      },
      ctx.checkpoint_timeout());
  data.set_position({state.epoch, state.batch_in_epoch});
  return state;
}

// The rank file's pipeline attributes, and rank 0's start-up lines.
void describe_pipeline(const RunContext& ctx, const TrainData& data, const PipelineStages& stages,
                       const std::vector<double>& costs, io::RunRecorder& recorder) {
  const auto& cfg = ctx.cfg;
  const auto& split = stages.split;
  const auto& topo = ctx.topo;
  const int n = ctx.mesh.pp(), rank = ctx.mesh.pp_rank(), v = cfg.pipeline.stages_per_rank;
  const int m = cfg.pipeline.microbatches;
  recorder.set_attribute("stage", rank);
  recorder.set_attribute("dp", ctx.mesh.dp());
  recorder.set_attribute("dp_rank", ctx.mesh.dp_rank());
  recorder.set_attribute("pp", ctx.mesh.pp());
  recorder.set_attribute("pp_rank", ctx.mesh.pp_rank());
  // The layers of stage rank (layer_begin, layer_end) and of its further stages rank + c n
  // (layer_begin_<c>, layer_end_<c>).
  for (int c = 0; c < v; ++c) {
    const auto r = split[static_cast<size_t>(stages.mine[static_cast<size_t>(c)])];
    const std::string suffix = c == 0 ? "" : "_" + std::to_string(c);
    recorder.set_attribute("layer_begin" + suffix, r.begin);
    recorder.set_attribute("layer_end" + suffix, r.end);
  }
  recorder.set_attribute("stages_per_rank", v);
  recorder.set_attribute("microbatches", m);
  recorder.set_attribute("zero", cfg.data_parallel.zero);
  if (!costs.empty()) {
    recorder.set_attribute("layer_time_embedding_s", costs.front());
    recorder.set_attribute("layer_time_block_s", costs[1]);
    recorder.set_attribute("layer_time_head_s", costs.back());
  }
  if (topo.rank == 0) {
    const std::string blocker = pipeline_graph_blocker(ctx);
    const std::string graphs =
        blocker.empty() ? "on (each micro-batch's forward and backward)" : "off (" + blocker + ")";
    const std::string replicas =
        ctx.mesh.dp() > 1 ? std::to_string(ctx.mesh.dp()) + " replicas of " : std::string();
    std::printf(
        "pp_train: %s%d rank(s) x %d stage(s) on %s, model %s, %s, schedule %s, "
        "%d micro-batch(es), global batch %lld x %lld tokens\n"
        "  %s split (layers, inclusive): %s\n"
        "  loss at %s positions (the data's targets: %.3f of positions), %s, CUDA graphs %s\n",
        replicas.c_str(), n, v,
        ctx.device.is_cuda() ? compat::device_name(ctx.device).c_str() : "cpu",
        model::describe(ctx.model_config).c_str(), name_string(cfg.pipeline.mode).c_str(),
        name_string(cfg.pipeline.schedule).c_str(), m, static_cast<long long>(cfg.optim.batch_size),
        static_cast<long long>(cfg.optim.seq_len),
        cfg.output.resume.empty() ? name_string(cfg.pipeline.partition).c_str() : "checkpoint's",
        pipeline::to_string(split).c_str(), name_string(cfg.compute.loss_positions).c_str(),
        data.target_fraction(), ctx.describe_kernels().c_str(), graphs.c_str());
    if (!costs.empty()) {
      std::printf(
          "  measured ms per micro-batch (fwd+bwd): embedding %.3f, block %.3f, head %.3f"
          " (= %.2f blocks)\n",
          1e3 * costs.front(), 1e3 * costs[1], 1e3 * costs.back(),
          costs[1] > 0 ? costs.back() / costs[1] : 0.0);
    }
    std::fflush(stdout);
  }
}

}  // namespace

int train_pipeline(const parallel::TrainConfig& cfg_in, const Topology& topo) {
  const StopSignals signals;  // SIGTERM/SIGINT: checkpoint after the step, then exit
  auto ctx = make_run_context(cfg_in, parallel::Program::kPipeline, topo);
  const auto& cfg = ctx.cfg;
  // This rank's pipeline: n ranks (the world with --dp 1; mesh.h).
  const int n = ctx.mesh.pp();
  // Its communicator, and its stages' replicas' (null with --dp 1).
  comm::Communicator* const pipe = ctx.comms.along(MeshDim::kPp);
  comm::Communicator* const replicas = ctx.comms.along(MeshDim::kDp);
  const int m = cfg.pipeline.microbatches;     // resolved: 1 for model parallelism
  const int v = cfg.pipeline.stages_per_rank;  // this rank runs stages rank, rank + n, ...
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
  open_train_data(ctx, ctx.mesh.dp_rank(), ctx.mesh.dp(), opened);
  TrainData& data = *opened;
  const auto positions = cfg.compute.loss_positions;
  // The head's cost depends on how many positions it runs at: the data's share of targets.
  const double loss_share = model::head_row_share(positions, data.target_fraction());
  std::vector<double> costs;
  if (cfg.pipeline.partition == pipeline::PartitionKind::kMeasured && cfg.output.resume.empty()) {
    // The head as the run runs it: at the targets, or everywhere with the targets weighted.
    pipeline::LayerTiming timing;
    timing.loss_fraction = data.target_fraction();
    timing.kernels = ctx.kernels;
    timing.graphs = pipeline_graph_blocker(ctx).empty();
    timing.microbatches = m;
    timing.positions = positions;
    costs = measured_layer_costs(*pipe, ctx.model_config, data.local_batch() / m, cfg.optim.seq_len,
                                 ctx.autocast, timing);
    // Every replica splits as replica 0 measured, or their stages would differ.
    if (replicas != nullptr) costs = broadcast_costs(*replicas, costs);
    compat::reset_peak_memory(ctx.device);
  }
  pipeline::Partition split;  // agreed: a checkpoint every rank rejects is reported once
  cli::on_every_rank(
      [&] {
        split = cfg.output.resume.empty()
                    ? stage_partition(cfg.pipeline.partition, ctx.model_config, n_stages,
                                      cfg.optim.seq_len, costs, v, loss_share)
                    : checkpoint_partition(cfg.output.resume, n_stages, ctx.mesh.dp());
      },
      ctx.checkpoint_timeout());
  GPT2P_CHECK(cfg.optim.grad_accum == 1,
              "pp_train does not take --grad-accum " << cfg.optim.grad_accum,
              "use --microbatches: the pipeline accumulates over its micro-batches");

  auto stages = make_stages(ctx, std::move(split));
  const model::TrainState state =
      cfg.output.resume.empty() ? model::TrainState() : resume_stages(ctx, data, stages);

  // A resumed run continues its rank files (the steps before the checkpoint stay recorded).
  io::RunRecorder recorder(
      cfg.output.out, run_identity(ctx, "pp_train"),
      cfg.output.resume.empty() ? io::RecordMode::kCreate : io::RecordMode::kAppend);
  describe_pipeline(ctx, data, stages, costs, recorder);
  LossScaler scaler(cfg.loss_scale,
                    {state.loss_scale, state.loss_scale_good_steps, state.skipped_steps});
  const auto strategy =
      make_pipeline_step(ctx, data, std::move(stages), loss_share, recorder, scaler);
  if (ctx.topo.rank == 0) write_run_config(cfg, parallel::Program::kPipeline);
  return run_training(
      ctx, data, recorder, state,
      {"pp_train", topo.rank, topo.size, static_cast<double>(ctx.mesh.dp()), &scaler}, *strategy);
}

}  // namespace gpt2p::parallel
