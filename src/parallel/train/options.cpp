#include "gpt2p/parallel/train/options.h"

#include <cmath>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <type_traits>

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

using cli::named_value;
using cli::UsageError;

void require(bool ok, const std::string& message) {
  if (!ok) throw UsageError(message);
}

// A notifier for a flag's value: a value the user gave that fails `ok` is a UsageError naming the
// flag, the value and the allowed range. The -1 "not given" defaults never reach it.
template <class T, class Pred>
std::function<void(const T&)> allowed(const char* flag, Pred ok, const char* range) {
  return [flag, ok, range](const T& v) {
    // inf and nan pass many a range test (inf > 0), and no flag of ours means them.
    bool finite = true;
    if constexpr (std::is_floating_point_v<T>) finite = std::isfinite(v);
    if (finite && ok(v)) return;
    std::ostringstream s;
    s << "--" << flag << " " << v << " is out of range: use " << range;
    throw UsageError(s.str());
  };
}

// A flag's help: the names of E (the one table of its spellings), then `rest`.
template <class E>
std::string help(const char* rest) {
  return choices<E>() + rest;
}

// The --schedule values whose kinds run one stage per rank (false) or several (true): "a and b".
std::string schedules_with(bool several_stages_per_rank) {
  std::string out;
  for (const pipeline::ScheduleInfo& s : pipeline::kSchedules) {
    if (s.several_stages_per_rank != several_stages_per_rank) continue;
    out += (out.empty() ? "" : " and ") + std::string(s.name);
  }
  return out;
}

template <class T>
std::function<void(const T&)> positive(const char* flag) {
  return allowed<T>(
      flag, [](T v) { return v > 0; }, "a value > 0");
}

template <class T>
std::function<void(const T&)> non_negative(const char* flag, const char* range = "a value >= 0") {
  return allowed<T>(
      flag, [](T v) { return v >= 0; }, range);
}

}  // namespace

// Flag tables: one flag a line, so a diff shows the flag it changes.
// clang-format off
void add_train_options(po::options_description& desc, TrainConfig& c, Program program) {
  po::options_description model("Model");
  model.add_options()
      ("preset", po::value(&c.preset), "tiny | gpt2 | gpt2-medium | gpt2-large | gpt2-xl (default: gpt2 on cuda, tiny on cpu)")
      ("n-layer", po::value(&c.n_layer)->notifier(positive<int>("n-layer")), "override: number of transformer blocks")
      ("n-head", po::value(&c.n_head)->notifier(positive<int>("n-head")), "override: attention heads")
      ("n-embd", po::value(&c.n_embd)->notifier(positive<int>("n-embd")), "override: model width")
      ("dropout", po::value(&c.dropout)->notifier(allowed<double>("dropout", [](double p) { return p >= 0 && p < 1; }, "a probability in [0, 1)")), "override: dropout probability (preset: 0.1)");
  po::options_description data("Data");
  data.add_options()
      ("data", po::value(&c.data)->default_value(c.data), "prepared dataset (HDF5, from prepare_data)")
      ("vocab-dir", po::value(&c.vocab_dir), "GPT-2 vocabulary (encoder.json + vocab.bpe, or vocab.json + merges.txt); default $GPT2P_VOCAB_DIR or .cache/gpt2-vocab")
      ("max-train-pairs", po::value(&c.max_train_pairs)->notifier(non_negative<int64_t>("max-train-pairs", "a count >= 0 (0 = all)")), "use the first N training pairs; 0 = all (default: 5000 on cuda as HW5, 128 on cpu)")
      ("max-eval-pairs", po::value(&c.max_eval_pairs)->notifier(non_negative<int64_t>("max-eval-pairs", "a count >= 0 (0 = all)")), "validation pairs evaluated per epoch; 0 = all (default: 256 on cuda, 32 on cpu)");
  po::options_description opt("Optimisation");
  opt.add_options()
      ("epochs", po::value(&c.epochs)->notifier(positive<int>("epochs")), "passes over the training pairs (default: 10 on cuda, 2 on cpu)")
      ("max-steps", po::value(&c.max_steps)->default_value(c.max_steps), "stop after this many optimizer steps; 0 = no limit")
      ("batch-size", po::value(&c.batch_size)->notifier(positive<int64_t>("batch-size")), "GLOBAL batch in sequences per optimizer step (default: 128 on cuda, 16 on cpu)")
      ("seq-len", po::value(&c.seq_len)->notifier(allowed<int64_t>("seq-len", [](int64_t n) { return n >= 2; }, "a length >= 2")), "tokens per sequence, max_len of HW5 (default: 128 on cuda, 32 on cpu)")
      ("grad-accum", po::value(&c.grad_accum)->default_value(c.grad_accum), "micro-steps accumulated per optimizer step")
      ("lr", po::value(&c.lr)->default_value(c.lr), "AdamW learning rate")
      ("weight-decay", po::value(&c.weight_decay)->notifier(non_negative<double>("weight-decay"))->default_value(c.weight_decay), "AdamW weight decay")
      ("grad-clip", po::value(&c.grad_clip)->notifier(non_negative<double>("grad-clip", "a norm >= 0 (0 = off)"))->default_value(c.grad_clip), "clip the global gradient norm to this; 0 = off")
      ("precision", named_value(c.precision, "precision"), help<model::Precision>(": fp32, TF32 matmuls, or autocast to bf16 (A100/H100/H200, CPU) or fp16 (CUDA GPUs; with dynamic loss scaling: a V100's half type)").c_str())
      ("loss-scale", named_value(c.loss_scale, "loss-scale"), help<LossScaleMode>(": dynamic loss scaling (the loss times a scale S, the gradients divided by S before clipping; a step whose gradients overflow is skipped and S halved, S doubled after --loss-scale-window good steps); auto = dynamic with --precision fp16").c_str())
      ("loss-scale-init", po::value(&c.loss_scale_init)->notifier(allowed<double>("loss-scale-init", [](double s) { return s >= 1.0 / 1024 && s <= 16777216.0; }, "a scale in [2^-10, 2^24]"))->default_value(c.loss_scale_init), "the first loss scale (a power of two keeps the scaling exact)")
      ("loss-scale-window", po::value(&c.loss_scale_window)->notifier(positive<int64_t>("loss-scale-window"))->default_value(c.loss_scale_window), "good steps in a row after which the loss scale doubles")
      ("loss-positions", named_value(c.loss_positions, "loss-positions"), "targets (the LM head and its cross-entropy run only where the loss mask counts: same loss and gradients, a fraction of the head's work) | all (every position, as a plain head)")
      ("device", named_value(c.device, "device"), help<DeviceKind>(" (auto: cuda when built with CUDA and a GPU is present)").c_str())
      ("kernels", named_value(c.kernels, "kernels"), help<model::Kernels>(": the LM head's softmax and cross-entropy by the project's CUDA kernels (fused) or ATen ops (reference); auto = fused on CUDA").c_str())
      ("attention", named_value(c.attention, "attention"), help<compat::Attention>(": the kernels scaled_dot_product_attention may use (auto: all, torch's choice); the start-up line names the one that runs").c_str())
      ("recompute", named_value(c.recompute, "recompute"), "none (keep every activation for backward) | blocks (keep each transformer block's input only and run the block again in backward, with the same dropout: activation memory of about one block per micro-batch, for about one more forward of the blocks)")
      ("seed", po::value(&c.seed)->default_value(c.seed), "seed for initialisation, shuffling and dropout")
      ("warmup-epochs", po::value(&c.warmup_epochs)->notifier(non_negative<int>("warmup-epochs"))->default_value(c.warmup_epochs), "epochs the analysis drops as warm-up (recorded in the output)");
  po::options_description out("Output");
  out.add_options()
      ("out", po::value(&c.out), "output directory: rank<r>.h5 timing files, checkpoints (default: runs/<program>)")
      ("init-from", po::value(&c.init_from), "initialise from a Hugging Face GPT-2 directory or one of our checkpoints")
      ("save-every", po::value(&c.save_every)->default_value(c.save_every), "checkpoint every N optimizer steps; 0 = at the end of each epoch; -1 = never (benchmarks)")
      ("resume", po::value(&c.resume), "resume from this checkpoint directory (model, optimizer, step, RNG, data position)")
      ("allow-unverified-checkpoint", po::bool_switch(&c.allow_unverified_checkpoint), "load a --resume or --init-from checkpoint whose meta.json lists no checksums (refused without it), with a warning")
      ("translate-samples", po::value(&c.translate_samples)->notifier(non_negative<int>("translate-samples", "a count >= 0 (0 = none)")), "test pairs greedily translated (and BLEU-scored) per epoch (default: 4 on cuda, 2 on cpu)")
      ("log-every", po::value(&c.log_every)->notifier(positive<int>("log-every"))->default_value(c.log_every), "rank 0 prints a progress line every N steps")
      ("profile", po::value(&c.profile), "write a Chrome trace of every rank's operators and CUDA kernels (libtorch's profiler) to DIR/trace_rank<r>.json, for --profile-steps steps after 5 others; analysis/kernel_table.py sums it per kernel")
      ("profile-steps", po::value(&c.profile_steps)->notifier(positive<int>("profile-steps"))->default_value(c.profile_steps), "steps --profile records")
      ("comm-timeout", po::value(&c.comm_timeout_s)->default_value(c.comm_timeout_s), "seconds a rank waits on a peer (a collective or a transfer, NCCL or MPI) before failing the job")
      ("comm", named_value(c.comm, "comm"), help<gpt2p::comm::Backend>(": how ranks talk; auto = nccl when every rank has a GPU of its own, else mpi (CUDA tensors staged through host memory: for development on one GPU, timings not meaningful)").c_str())
      ("overwrite", po::bool_switch(&c.overwrite), "let a fresh run replace the checkpoint and rank files already in --out (without it such a run is refused)");
  desc.add(model).add(data).add(opt).add(out);
  if (program == Program::kDataParallel) {
    po::options_description dp("Data parallel");
    dp.add_options()
        ("grad-sync", named_value(c.grad_sync, "grad-sync"), "per-param (one all_reduce per parameter, HW5) | bucketed (overlapped with backward)")
        ("bucket-mb", po::value(&c.bucket_mb)->notifier(positive<double>("bucket-mb"))->default_value(c.bucket_mb), "bucket size in MiB for --grad-sync bucketed")
        ("reduce-dtype", named_value(c.reduce_dtype, "reduce-dtype"), help<ReduceDtype>(": dtype gradients travel in").c_str())
        ("embedding-sync", named_value(c.embedding_sync, "embedding-sync"), "the tied wte under --grad-sync bucketed: sparse (the head's part reduced as soon as backward starts, the token lookup's B*T gradient rows all-gathered) | dense (one 50k-row all_reduce after backward)")
        ("zero", po::value(&c.zero)->notifier(allowed<int>("zero", [](int z) { return z == 0 || z == 1; }, "0 or 1"))->default_value(c.zero), "ZeRO stage: 1 = shard the AdamW state over the ranks (each keeps 1/N of it; gradients reduce-scattered in --bucket-mb buckets during backward, parameters all-gathered after the step); 0 = every rank keeps all of it");
    desc.add(dp);
  }
  if (program == Program::kPipeline) {
    po::options_description pp("Pipeline parallel");
    pp.add_options()
        ("mode", named_value(c.mode, "mode"), help<PipelineMode>(" (whole batch as one micro-batch, HW5's baseline)").c_str())
        ("schedule", named_value(c.schedule, "schedule"), help<pipeline::ScheduleKind>(" (1F1B over --stages-per-rank stages per rank, Megatron's virtual pipeline: a smaller bubble at the same micro-batch size; --microbatches a multiple of the ranks)").c_str())
        ("stages-per-rank", po::value(&c.stages_per_rank)->default_value(c.stages_per_rank), ("stages each rank holds, rank r the stages r, r + ranks, ...: 1 for " + schedules_with(false) + ", >= 2 for " + schedules_with(true) + " (0 = 2 there)").c_str())
        ("microbatches", po::value(&c.microbatches)->default_value(c.microbatches), "micro-batches per step (HW5's n_chunk); must divide --batch-size (with --dp D: a replica's batch, --batch-size / D)")
        ("dp", po::value(&c.dp)->notifier(positive<int>("dp"))->default_value(c.dp), "data-parallel replicas of the pipeline: mpirun -np D*P pp_train --dp D runs D pipelines of P ranks (ranks d*P .. d*P+P-1 are replica d), each on its share of the batch, their gradients averaged per stage")
        ("zero-bubble", po::bool_switch(&c.zero_bubble), "split every backward into B (the input gradient the previous stage waits for) and W (the weight gradients), and run the W's in the schedule's bubbles (Zero Bubble Pipeline Parallelism, Qi et al. 2024); any --schedule")
        ("zb-extra-live", po::value(&c.zb_extra_live)->default_value(c.zb_extra_live), "with --zero-bubble: micro-batches a rank may keep alive beyond the peak of the schedule without it, so that their W's can wait longer for a bubble (a waiting W keeps its blocks' linear inputs and output gradients). 0 = the memory of the schedule without --zero-bubble (ZB-H1); -1 = no limit")
        ("partition", named_value(c.partition, "partition"), "uniform (HW5: ceil(blocks/stages) each) | balanced (FLOP cost model) | measured (balanced by layer times rank 0 measures on its device before training); --resume keeps the checkpoint's split")
        ("zero", po::value(&c.zero)->notifier(allowed<int>("zero", [](int z) { return z == 0 || z == 1; }, "0 or 1"))->default_value(c.zero), "with --dp D >= 2: ZeRO stage 1, each stage's AdamW state sharded over its D replicas (gradients reduce-scattered after the schedule, parameters all-gathered after the step); 0 = not sharded")
        ("bucket-mb", po::value(&c.bucket_mb)->notifier(positive<double>("bucket-mb"))->default_value(c.bucket_mb), "with --dp D >= 2: size in MiB of the buckets the replicas' gradients are reduced in");
    desc.add(pp);
  }
}
// clang-format on

void resolve_train_config(TrainConfig& c, Program program, bool cuda_available) {
  if (c.device == DeviceKind::kAuto) {
    c.device = cuda_available ? DeviceKind::kCuda : DeviceKind::kCpu;
  }
  require(c.device != DeviceKind::kCuda || cuda_available,
          "--device cuda: this build has no CUDA or no GPU is visible (rebuild against a CUDA "
          "libtorch, or pass --device cpu)");
  const bool gpu = c.device == DeviceKind::kCuda;
  if (c.preset.empty()) c.preset = gpu ? "gpt2" : "tiny";
  // The CPU default is a demo that finishes in about a minute on two cores (the 50k-wide head
  // dominates the cost of the tiny model).
  if (c.max_train_pairs < 0) c.max_train_pairs = gpu ? 5000 : 128;
  if (c.max_eval_pairs < 0) c.max_eval_pairs = gpu ? 256 : 32;
  if (c.translate_samples < 0) c.translate_samples = gpu ? 4 : 2;
  if (c.epochs < 0) c.epochs = gpu ? 10 : 2;
  if (c.batch_size < 0) c.batch_size = gpu ? 128 : 16;
  if (c.seq_len < 0) c.seq_len = gpu ? 128 : 32;
  if (c.vocab_dir.empty()) {
    const char* env = std::getenv("GPT2P_VOCAB_DIR");
    c.vocab_dir = env != nullptr && *env != '\0' ? env : ".cache/gpt2-vocab";
  }
  if (c.out.empty()) c.out = std::string("runs/") + program_name(program);
  require(c.epochs > 0, "--epochs must be positive");
  require(c.batch_size > 0, "--batch-size must be positive");
  require(c.seq_len > 1, "--seq-len must be at least 2");
  require(c.grad_accum > 0, "--grad-accum must be positive");
  require(c.batch_size % c.grad_accum == 0, "--batch-size " + std::to_string(c.batch_size) +
                                                " is not divisible by --grad-accum " +
                                                std::to_string(c.grad_accum));
  require(c.lr > 0, "--lr must be positive");
  require(c.max_steps >= 0, "--max-steps must be >= 0");
  require(c.save_every >= -1, "--save-every must be a step count, 0 (every epoch) or -1 (never)");
  require(c.comm_timeout_s > 0 && std::isfinite(c.comm_timeout_s),
          "--comm-timeout must be a positive finite number of seconds");
  require(c.kernels != model::Kernels::kFused || gpu,
          "--kernels fused runs on CUDA only (pass --device cuda on a CUDA build, or --kernels "
          "reference)");
  require(c.precision != model::Precision::kFp16 || gpu,
          "--precision fp16 autocasts on CUDA GPUs only (pass --precision bf16 or fp32 on the "
          "CPU)");
  require(c.bucket_mb > 0 && std::isfinite(c.bucket_mb),
          "--bucket-mb must be a positive finite size");
  require(c.zero == 0 || c.zero == 1, "--zero " + std::to_string(c.zero) + ": use 0 or 1");
  require(
      c.zero == 0 || program != Program::kDataParallel || c.grad_sync == GradSyncMode::kBucketed,
      "--zero 1 reduce-scatters gradient buckets: it does not combine with --grad-sync "
      "per-param (drop one of them)");
  require(c.zb_extra_live >= -1,
          "--zb-extra-live " + std::to_string(c.zb_extra_live) +
              ": use 0 (the memory of the schedule without --zero-bubble), more, or -1 (no limit)");
  if (c.mode == PipelineMode::kModelParallel &&
      pipeline::schedule_info(c.schedule).several_stages_per_rank) {
    // One micro-batch over one stage per rank: every schedule is the same.
    c.schedule = pipeline::ScheduleKind::kOneFOneB;
    c.stages_per_rank = 1;
  }
  const bool several = pipeline::schedule_info(c.schedule).several_stages_per_rank;
  if (c.stages_per_rank == 0) c.stages_per_rank = several ? 2 : 1;
  require(several ? c.stages_per_rank >= 2 : c.stages_per_rank == 1,
          "--stages-per-rank " + std::to_string(c.stages_per_rank) + " does not fit --schedule " +
              name_string(c.schedule) + ": use 1 with " + schedules_with(false) +
              ", 2 or more with " + schedules_with(true));
  require(c.microbatches > 0, "--microbatches must be positive");
  if (program == Program::kPipeline && c.mode == PipelineMode::kModelParallel) c.microbatches = 1;
  require(program != Program::kPipeline || c.batch_size % c.microbatches == 0,
          "--microbatches " + std::to_string(c.microbatches) + " does not divide --batch-size " +
              std::to_string(c.batch_size) + ": pick M with batch % M == 0");
}

nlohmann::json to_json(const TrainConfig& c) {
  return {{"preset", c.preset},
          {"n_layer", c.n_layer},
          {"n_head", c.n_head},
          {"n_embd", c.n_embd},
          {"dropout", c.dropout},
          {"data", c.data},
          {"vocab_dir", c.vocab_dir},
          {"max_train_pairs", c.max_train_pairs},
          {"max_eval_pairs", c.max_eval_pairs},
          {"epochs", c.epochs},
          {"max_steps", c.max_steps},
          {"batch_size", c.batch_size},
          {"seq_len", c.seq_len},
          {"grad_accum", c.grad_accum},
          {"lr", c.lr},
          {"weight_decay", c.weight_decay},
          {"grad_clip", c.grad_clip},
          {"precision", name_string(c.precision)},
          {"loss_scale", name_string(c.loss_scale)},
          {"loss_scale_init", c.loss_scale_init},
          {"loss_scale_window", c.loss_scale_window},
          {"device", name_string(c.device)},
          {"seed", c.seed},
          {"warmup_epochs", c.warmup_epochs},
          {"out", c.out},
          {"init_from", c.init_from},
          {"allow_unverified_checkpoint", c.allow_unverified_checkpoint},
          {"save_every", c.save_every},
          {"resume", c.resume},
          {"translate_samples", c.translate_samples},
          {"grad_sync", name_string(c.grad_sync)},
          {"bucket_mb", c.bucket_mb},
          {"reduce_dtype", name_string(c.reduce_dtype)},
          {"embedding_sync", name_string(c.embedding_sync)},
          {"zero", c.zero},
          {"recompute", name_string(c.recompute)},
          {"loss_positions", name_string(c.loss_positions)},
          {"mode", name_string(c.mode)},
          {"schedule", name_string(c.schedule)},
          {"microbatches", c.microbatches},
          {"dp", c.dp},
          {"stages_per_rank", c.stages_per_rank},
          {"zero_bubble", c.zero_bubble},
          {"zb_extra_live", c.zb_extra_live},
          {"partition", name_string(c.partition)},
          {"comm_timeout_s", c.comm_timeout_s},
          {"comm", name_string(c.comm)},
          {"overwrite", c.overwrite},
          {"kernels", name_string(c.kernels)},
          {"attention", name_string(c.attention)},
          {"profile", c.profile},
          {"profile_steps", c.profile_steps}};
}

bool parse_train_args(TrainConfig& cfg, Program program, int argc, char** argv) {
  po::options_description desc;
  add_train_options(desc, cfg, program);
  po::variables_map vm;
  static const char* const kSummary[] = {
      "Single-rank GPT-2 training on German->English pairs (CPU or one GPU).",
      "Data-parallel GPT-2 training: mpirun -np N dp_train [options]; gradients averaged each "
      "step.",
      "Pipeline-parallel GPT-2 training: mpirun -np RANKS pp_train [options] (GPipe, 1F1B or "
      "interleaved 1F1B)."};
  return cli::parse_or_help(program_name(program), kSummary[static_cast<int>(program)], desc, argc,
                            argv, vm);
}

}  // namespace gpt2p::parallel
