#include "gpt2p/parallel/train/options.h"

#include <cmath>

#include "gpt2p/cli/options.h"
#include "gpt2p/data/bpe_tokenizer.h"

namespace gpt2p::parallel {

const char* program_name(Program p) {
  switch (p) {
    case Program::kSingle: return "gpt2_train";
    case Program::kDataParallel: return "dp_train";
    case Program::kPipeline: return "pp_train";
  }
  return "?";
}

namespace {

void require(bool ok, const std::string& message) {
  if (!ok) throw cli::UsageError(message);
}

}  // namespace

void resolve_train_config(TrainConfig& c, Program program, bool cuda_available) {
  if (c.compute.device == DeviceKind::kAuto) {
    c.compute.device = cuda_available ? DeviceKind::kCuda : DeviceKind::kCpu;
  }
  require(c.compute.device != DeviceKind::kCuda || cuda_available,
          "--device cuda: this build has no CUDA or no GPU is visible (rebuild against a CUDA "
          "libtorch, or pass --device cpu)");
  const bool gpu = c.compute.device == DeviceKind::kCuda;
  if (c.model.preset.empty()) c.model.preset = gpu ? "gpt2" : "tiny";
  // The CPU default is a demo that finishes in about a minute on two cores (the 50k-wide head
  // dominates the cost of the tiny model).
  if (c.data.max_train_pairs < 0) c.data.max_train_pairs = gpu ? 5000 : 128;
  if (c.data.max_eval_pairs < 0) c.data.max_eval_pairs = gpu ? 256 : 32;
  if (c.output.translate_samples < 0) c.output.translate_samples = gpu ? 4 : 2;
  if (c.optim.epochs < 0) c.optim.epochs = gpu ? 10 : 2;
  if (c.optim.batch_size < 0) c.optim.batch_size = gpu ? 128 : 16;
  if (c.optim.seq_len < 0) c.optim.seq_len = gpu ? 128 : 32;
  if (c.data.vocab_dir.empty()) c.data.vocab_dir = data::default_vocab_dir();
  if (c.output.out.empty()) c.output.out = std::string("runs/") + program_name(program);
  require(c.optim.epochs > 0, "--epochs must be positive");
  require(c.optim.batch_size > 0, "--batch-size must be positive");
  require(c.optim.seq_len > 1, "--seq-len must be at least 2");
  require(c.optim.grad_accum > 0, "--grad-accum must be positive");
  require(c.optim.batch_size % c.optim.grad_accum == 0,
          "--batch-size " + std::to_string(c.optim.batch_size) +
              " is not divisible by --grad-accum " + std::to_string(c.optim.grad_accum));
  require(c.optim.lr > 0, "--lr must be positive");
  require(c.optim.max_steps >= 0, "--max-steps must be >= 0");
  require(c.output.save_every >= -1,
          "--save-every must be a step count, 0 (every epoch) or -1 (never)");
  require(c.comm.timeout_s > 0 && std::isfinite(c.comm.timeout_s),
          "--comm-timeout must be a positive finite number of seconds");
  require(c.compute.kernels != model::Kernels::kFused || gpu,
          "--kernels fused runs on CUDA only (pass --device cuda on a CUDA build, or --kernels "
          "reference)");
  require(c.compute.precision != model::Precision::kFp16 || gpu,
          "--precision fp16 autocasts on CUDA GPUs only (pass --precision bf16 or fp32 on the "
          "CPU)");
  if (c.loss_scale.mode == LossScaleMode::kAuto) {
    c.loss_scale.mode = c.compute.precision == model::Precision::kFp16 ? LossScaleMode::kDynamic
                                                                       : LossScaleMode::kOff;
  }
  require(c.data_parallel.bucket_mb > 0 && std::isfinite(c.data_parallel.bucket_mb),
          "--bucket-mb must be a positive finite size");
  require(c.data_parallel.zero == 0 || c.data_parallel.zero == 1,
          "--zero " + std::to_string(c.data_parallel.zero) + ": use 0 or 1");
  require(c.data_parallel.zero == 0 || program != Program::kDataParallel ||
              c.data_parallel.grad_sync == GradSyncMode::kBucketed,
          "--zero 1 reduce-scatters gradient buckets: it does not combine with --grad-sync "
          "per-param (drop one of them)");
  require(c.pipeline.zb_extra_live >= -1,
          "--zb-extra-live " + std::to_string(c.pipeline.zb_extra_live) +
              ": use 0 (the memory of the schedule without --zero-bubble), more, or -1 (no limit)");
  if (c.pipeline.mode == PipelineMode::kModelParallel &&
      pipeline::schedule_info(c.pipeline.schedule).several_stages_per_rank) {
    // One micro-batch over one stage per rank: every schedule is the same.
    c.pipeline.schedule = pipeline::ScheduleKind::kOneFOneB;
    c.pipeline.stages_per_rank = 1;
  }
  const bool several = pipeline::schedule_info(c.pipeline.schedule).several_stages_per_rank;
  if (c.pipeline.stages_per_rank == 0) c.pipeline.stages_per_rank = several ? 2 : 1;
  require(several ? c.pipeline.stages_per_rank >= 2 : c.pipeline.stages_per_rank == 1,
          "--stages-per-rank " + std::to_string(c.pipeline.stages_per_rank) +
              " does not fit --schedule " + name_string(c.pipeline.schedule) + ": use 1 with " +
              pipeline::schedule_names(false) + ", 2 or more with " +
              pipeline::schedule_names(true));
  require(c.pipeline.microbatches > 0, "--microbatches must be positive");
  if (program == Program::kPipeline && c.pipeline.mode == PipelineMode::kModelParallel)
    c.pipeline.microbatches = 1;
  require(program != Program::kPipeline || c.optim.batch_size % c.pipeline.microbatches == 0,
          "--microbatches " + std::to_string(c.pipeline.microbatches) +
              " does not divide --batch-size " + std::to_string(c.optim.batch_size) +
              ": pick M with batch % M == 0");
}

nlohmann::json to_json(const TrainConfig& c) {
  return {{"preset", c.model.preset},
          {"n_layer", c.model.n_layer},
          {"n_head", c.model.n_head},
          {"n_embd", c.model.n_embd},
          {"dropout", c.model.dropout},
          {"data", c.data.path},
          {"vocab_dir", c.data.vocab_dir},
          {"max_train_pairs", c.data.max_train_pairs},
          {"max_eval_pairs", c.data.max_eval_pairs},
          {"epochs", c.optim.epochs},
          {"max_steps", c.optim.max_steps},
          {"batch_size", c.optim.batch_size},
          {"seq_len", c.optim.seq_len},
          {"grad_accum", c.optim.grad_accum},
          {"lr", c.optim.lr},
          {"weight_decay", c.optim.weight_decay},
          {"grad_clip", c.optim.grad_clip},
          {"precision", name_string(c.compute.precision)},
          {"loss_scale", name_string(c.loss_scale.mode)},
          {"loss_scale_init", c.loss_scale.init},
          {"loss_scale_window", c.loss_scale.window},
          {"device", name_string(c.compute.device)},
          {"seed", c.optim.seed},
          {"warmup_epochs", c.optim.warmup_epochs},
          {"out", c.output.out},
          {"init_from", c.output.init_from},
          {"allow_unverified_checkpoint", c.output.allow_unverified_checkpoint},
          {"save_every", c.output.save_every},
          {"resume", c.output.resume},
          {"translate_samples", c.output.translate_samples},
          {"grad_sync", name_string(c.data_parallel.grad_sync)},
          {"bucket_mb", c.data_parallel.bucket_mb},
          {"reduce_dtype", name_string(c.data_parallel.reduce_dtype)},
          {"embedding_sync", name_string(c.data_parallel.embedding_sync)},
          {"zero", c.data_parallel.zero},
          {"recompute", name_string(c.compute.recompute)},
          {"loss_positions", name_string(c.compute.loss_positions)},
          {"mode", name_string(c.pipeline.mode)},
          {"schedule", name_string(c.pipeline.schedule)},
          {"microbatches", c.pipeline.microbatches},
          {"dp", c.pipeline.dp},
          {"stages_per_rank", c.pipeline.stages_per_rank},
          {"zero_bubble", c.pipeline.zero_bubble},
          {"zb_extra_live", c.pipeline.zb_extra_live},
          {"partition", name_string(c.pipeline.partition)},
          {"comm_timeout_s", c.comm.timeout_s},
          {"comm", name_string(c.comm.backend)},
          {"overwrite", c.output.overwrite},
          {"kernels", name_string(c.compute.kernels)},
          {"attention", name_string(c.compute.attention)},
          {"cuda_graphs", name_string(c.compute.cuda_graphs)},
          {"profile", c.output.profile},
          {"profile_steps", c.output.profile_steps}};
}

}  // namespace gpt2p::parallel
