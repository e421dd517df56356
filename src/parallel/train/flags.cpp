#include "gpt2p/parallel/train/flags.h"

#include <cmath>
#include <filesystem>
#include <functional>
#include <sstream>
#include <type_traits>

#include "gpt2p/core/atomic_file.h"

namespace gpt2p::parallel {

namespace {

using cli::named_value;
using cli::UsageError;

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
      ("preset", po::value(&c.model.preset), "tiny | gpt2 | gpt2-medium | gpt2-large | gpt2-xl (default: gpt2 on cuda, tiny on cpu)")
      ("n-layer", po::value(&c.model.n_layer)->notifier(positive<int>("n-layer")), "override: number of transformer blocks")
      ("n-head", po::value(&c.model.n_head)->notifier(positive<int>("n-head")), "override: attention heads")
      ("n-embd", po::value(&c.model.n_embd)->notifier(positive<int>("n-embd")), "override: model width")
      ("dropout", po::value(&c.model.dropout)->notifier(allowed<double>("dropout", [](double p) { return p >= 0 && p < 1; }, "a probability in [0, 1)")), "override: dropout probability (preset: 0.1)");
  po::options_description data("Data");
  data.add_options()
      ("data", po::value(&c.data.path)->default_value(c.data.path), "prepared dataset (HDF5, from prepare_data)")
      ("vocab-dir", po::value(&c.data.vocab_dir), "GPT-2 vocabulary (encoder.json + vocab.bpe, or vocab.json + merges.txt); default $GPT2P_VOCAB_DIR or .cache/gpt2-vocab")
      ("max-train-pairs", po::value(&c.data.max_train_pairs)->notifier(non_negative<int64_t>("max-train-pairs", "a count >= 0 (0 = all)")), "use the first N training pairs; 0 = all (default: 5000 on cuda as HW5, 128 on cpu)")
      ("max-eval-pairs", po::value(&c.data.max_eval_pairs)->notifier(non_negative<int64_t>("max-eval-pairs", "a count >= 0 (0 = all)")), "validation pairs evaluated per epoch; 0 = all (default: 256 on cuda, 32 on cpu)");
  po::options_description opt("Optimisation");
  opt.add_options()
      ("epochs", po::value(&c.optim.epochs)->notifier(positive<int>("epochs")), "passes over the training pairs (default: 10 on cuda, 2 on cpu)")
      ("max-steps", po::value(&c.optim.max_steps)->default_value(c.optim.max_steps), "stop after this many optimizer steps; 0 = no limit")
      ("batch-size", po::value(&c.optim.batch_size)->notifier(positive<int64_t>("batch-size")), "GLOBAL batch in sequences per optimizer step (default: 128 on cuda, 16 on cpu)")
      ("seq-len", po::value(&c.optim.seq_len)->notifier(allowed<int64_t>("seq-len", [](int64_t n) { return n >= 2; }, "a length >= 2")), "tokens per sequence, max_len of HW5 (default: 128 on cuda, 32 on cpu)")
      ("grad-accum", po::value(&c.optim.grad_accum)->default_value(c.optim.grad_accum), "micro-steps accumulated per optimizer step")
      ("lr", po::value(&c.optim.lr)->default_value(c.optim.lr), "AdamW learning rate")
      ("weight-decay", po::value(&c.optim.weight_decay)->notifier(non_negative<double>("weight-decay"))->default_value(c.optim.weight_decay), "AdamW weight decay")
      ("grad-clip", po::value(&c.optim.grad_clip)->notifier(non_negative<double>("grad-clip", "a norm >= 0 (0 = off)"))->default_value(c.optim.grad_clip), "clip the global gradient norm to this; 0 = off")
      ("seed", po::value(&c.optim.seed)->default_value(c.optim.seed), "seed for initialisation, shuffling and dropout")
      ("warmup-epochs", po::value(&c.optim.warmup_epochs)->notifier(non_negative<int>("warmup-epochs"))->default_value(c.optim.warmup_epochs), "epochs the analysis drops as warm-up (recorded in the output)");
  po::options_description scale("Loss scaling");
  scale.add_options()
      ("loss-scale", named_value(c.loss_scale.mode, "loss-scale"), help<LossScaleMode>(": dynamic loss scaling (the loss times a scale S, the gradients divided by S before clipping; a step whose gradients overflow is skipped and S halved, S doubled after --loss-scale-window good steps); auto = dynamic with --precision fp16").c_str())
      ("loss-scale-init", po::value(&c.loss_scale.init)->notifier(allowed<double>("loss-scale-init", [](double s) { return s >= 1.0 / 1024 && s <= 16777216.0; }, "a scale in [2^-10, 2^24]"))->default_value(c.loss_scale.init), "the first loss scale (a power of two keeps the scaling exact)")
      ("loss-scale-window", po::value(&c.loss_scale.window)->notifier(positive<int64_t>("loss-scale-window"))->default_value(c.loss_scale.window), "good steps in a row after which the loss scale doubles");
  po::options_description compute("Compute");
  compute.add_options()
      ("device", named_value(c.compute.device, "device"), help<DeviceKind>(" (auto: cuda when built with CUDA and a GPU is present)").c_str())
      ("precision", named_value(c.compute.precision, "precision"), help<model::Precision>(": fp32, TF32 matmuls, or autocast to bf16 (A100/H100/H200, CPU) or fp16 (CUDA GPUs; with dynamic loss scaling: a V100's half type)").c_str())
      ("kernels", named_value(c.compute.kernels, "kernels"), help<model::Kernels>(": the LM head's softmax and cross-entropy by the project's CUDA kernels (fused) or ATen ops (reference); auto = fused on CUDA").c_str())
      ("attention", named_value(c.compute.attention, "attention"), help<compat::Attention>(": the kernels scaled_dot_product_attention may use (auto: all, torch's choice); the start-up line names the one that runs").c_str())
      ("recompute", named_value(c.compute.recompute, "recompute"), "none (keep every activation for backward) | blocks (keep each transformer block's input only and run the block again in backward, with the same dropout: activation memory of about one block per micro-batch, for about one more forward of the blocks)")
      ("loss-positions", named_value(c.compute.loss_positions, "loss-positions"), "targets (the LM head and its cross-entropy run only where the loss mask counts: same loss and gradients, a fraction of the head's work) | all (every position, as a plain head)");
  po::options_description out("Output");
  out.add_options()
      ("out", po::value(&c.output.out), "output directory: rank<r>.h5 timing files, checkpoints (default: runs/<program>)")
      ("init-from", po::value(&c.output.init_from), "initialise from a Hugging Face GPT-2 directory or one of our checkpoints")
      ("save-every", po::value(&c.output.save_every)->default_value(c.output.save_every), "checkpoint every N optimizer steps; 0 = at the end of each epoch; -1 = never (benchmarks)")
      ("resume", po::value(&c.output.resume), "resume from this checkpoint directory (model, optimizer, step, RNG, data position)")
      ("allow-unverified-checkpoint", po::bool_switch(&c.output.allow_unverified_checkpoint), "load a --resume or --init-from checkpoint whose meta.json lists no checksums (refused without it), with a warning")
      ("overwrite", po::bool_switch(&c.output.overwrite), "let a fresh run replace the checkpoint and rank files already in --out (without it such a run is refused)")
      ("translate-samples", po::value(&c.output.translate_samples)->notifier(non_negative<int>("translate-samples", "a count >= 0 (0 = none)")), "test pairs greedily translated (and BLEU-scored) per epoch (default: 4 on cuda, 2 on cpu)")
      ("log-every", po::value(&c.output.log_every)->notifier(positive<int>("log-every"))->default_value(c.output.log_every), "rank 0 prints a progress line every N steps")
      ("profile", po::value(&c.output.profile), "write a Chrome trace of every rank's operators and CUDA kernels (libtorch's profiler) to DIR/trace_rank<r>.json, for --profile-steps steps after 5 others; analysis/kernel_table.py sums it per kernel")
      ("profile-steps", po::value(&c.output.profile_steps)->notifier(positive<int>("profile-steps"))->default_value(c.output.profile_steps), "steps --profile records");
  po::options_description comm("Communication");
  comm.add_options()
      ("comm", named_value(c.comm.backend, "comm"), help<gpt2p::comm::Backend>(": how ranks talk; auto = nccl when every rank has a GPU of its own, else mpi (CUDA tensors staged through host memory: for development on one GPU, timings not meaningful)").c_str())
      ("comm-timeout", po::value(&c.comm.timeout_s)->default_value(c.comm.timeout_s), "seconds a rank waits on a peer (a collective or a transfer, NCCL or MPI) before failing the job");
  desc.add(model).add(data).add(opt).add(scale).add(compute).add(out).add(comm);
  if (program == Program::kDataParallel) {
    po::options_description dp("Data parallel");
    dp.add_options()
        ("grad-sync", named_value(c.data_parallel.grad_sync, "grad-sync"), "per-param (one all_reduce per parameter, HW5) | bucketed (overlapped with backward)")
        ("bucket-mb", po::value(&c.data_parallel.bucket_mb)->notifier(positive<double>("bucket-mb"))->default_value(c.data_parallel.bucket_mb), "bucket size in MiB for --grad-sync bucketed")
        ("reduce-dtype", named_value(c.data_parallel.reduce_dtype, "reduce-dtype"), help<ReduceDtype>(": dtype gradients travel in").c_str())
        ("embedding-sync", named_value(c.data_parallel.embedding_sync, "embedding-sync"), "the tied wte under --grad-sync bucketed: sparse (the head's part reduced as soon as backward starts, the token lookup's B*T gradient rows all-gathered) | dense (one 50k-row all_reduce after backward)")
        ("zero", po::value(&c.data_parallel.zero)->notifier(allowed<int>("zero", [](int z) { return z == 0 || z == 1; }, "0 or 1"))->default_value(c.data_parallel.zero), "ZeRO stage: 1 = shard the AdamW state over the ranks (each keeps 1/N of it; gradients reduce-scattered in --bucket-mb buckets during backward, parameters all-gathered after the step); 0 = every rank keeps all of it");
    desc.add(dp);
  }
  if (program == Program::kPipeline) {
    po::options_description pp("Pipeline parallel");
    pp.add_options()
        ("mode", named_value(c.pipeline.mode, "mode"), help<PipelineMode>(" (whole batch as one micro-batch, HW5's baseline)").c_str())
        ("schedule", named_value(c.pipeline.schedule, "schedule"), help<pipeline::ScheduleKind>(" (1F1B over --stages-per-rank stages per rank, Megatron's virtual pipeline: a smaller bubble at the same micro-batch size; --microbatches a multiple of the ranks)").c_str())
        ("stages-per-rank", po::value(&c.pipeline.stages_per_rank)->default_value(c.pipeline.stages_per_rank), ("stages each rank holds, rank r the stages r, r + ranks, ...: 1 for " + pipeline::schedule_names(false) + ", >= 2 for " + pipeline::schedule_names(true) + " (0 = 2 there)").c_str())
        ("microbatches", po::value(&c.pipeline.microbatches)->default_value(c.pipeline.microbatches), "micro-batches per step (HW5's n_chunk); must divide --batch-size (with --dp D: a replica's batch, --batch-size / D)")
        ("dp", po::value(&c.pipeline.dp)->notifier(positive<int>("dp"))->default_value(c.pipeline.dp), "data-parallel replicas of the pipeline: mpirun -np D*P pp_train --dp D runs D pipelines of P ranks (ranks d*P .. d*P+P-1 are replica d), each on its share of the batch, their gradients averaged per stage")
        ("zero-bubble", po::bool_switch(&c.pipeline.zero_bubble), "split every backward into B (the input gradient the previous stage waits for) and W (the weight gradients), and run the W's in the schedule's bubbles (Zero Bubble Pipeline Parallelism, Qi et al. 2024); any --schedule")
        ("zb-extra-live", po::value(&c.pipeline.zb_extra_live)->default_value(c.pipeline.zb_extra_live), "with --zero-bubble: micro-batches a rank may keep alive beyond the peak of the schedule without it, so that their W's can wait longer for a bubble (a waiting W keeps its blocks' linear inputs and output gradients). 0 = the memory of the schedule without --zero-bubble (ZB-H1); -1 = no limit")
        ("partition", named_value(c.pipeline.partition, "partition"), "uniform (HW5: ceil(blocks/stages) each) | balanced (FLOP cost model) | measured (balanced by layer times rank 0 measures on its device before training); --resume keeps the checkpoint's split")
        ("zero", po::value(&c.data_parallel.zero)->notifier(allowed<int>("zero", [](int z) { return z == 0 || z == 1; }, "0 or 1"))->default_value(c.data_parallel.zero), "with --dp D >= 2: ZeRO stage 1, each stage's AdamW state sharded over its D replicas (gradients reduce-scattered after the schedule, parameters all-gathered after the step); 0 = not sharded")
        ("bucket-mb", po::value(&c.data_parallel.bucket_mb)->notifier(positive<double>("bucket-mb"))->default_value(c.data_parallel.bucket_mb), "with --dp D >= 2: size in MiB of the buckets the replicas' gradients are reduced in");
    desc.add(pp);
  }
}
// clang-format on

std::string to_config_file(const TrainConfig& c, Program program) {
  using cli::config_value;
  cli::ConfigEntries e;
  // The model overrides hold -1 for "the preset's value", which their flags refuse: left out.
  const std::pair<const char*, int> overrides[] = {
      {"n-layer", c.model.n_layer}, {"n-head", c.model.n_head}, {"n-embd", c.model.n_embd}};
  e.push_back({"preset", c.model.preset});
  for (const auto& [flag, value] : overrides) {
    if (value > 0) e.push_back({flag, config_value(value)});
  }
  if (c.model.dropout >= 0) e.push_back({"dropout", config_value(c.model.dropout)});
  e.insert(e.end(), {{"data", c.data.path},
                     {"vocab-dir", c.data.vocab_dir},
                     {"max-train-pairs", config_value(c.data.max_train_pairs)},
                     {"max-eval-pairs", config_value(c.data.max_eval_pairs)},
                     {"epochs", config_value(c.optim.epochs)},
                     {"max-steps", config_value(c.optim.max_steps)},
                     {"batch-size", config_value(c.optim.batch_size)},
                     {"seq-len", config_value(c.optim.seq_len)},
                     {"grad-accum", config_value(c.optim.grad_accum)},
                     {"lr", config_value(c.optim.lr)},
                     {"weight-decay", config_value(c.optim.weight_decay)},
                     {"grad-clip", config_value(c.optim.grad_clip)},
                     {"seed", config_value(c.optim.seed)},
                     {"warmup-epochs", config_value(c.optim.warmup_epochs)},
                     {"loss-scale", config_value(c.loss_scale.mode)},
                     {"loss-scale-init", config_value(c.loss_scale.init)},
                     {"loss-scale-window", config_value(c.loss_scale.window)},
                     {"device", config_value(c.compute.device)},
                     {"precision", config_value(c.compute.precision)},
                     {"kernels", config_value(c.compute.kernels)},
                     {"attention", config_value(c.compute.attention)},
                     {"recompute", config_value(c.compute.recompute)},
                     {"loss-positions", config_value(c.compute.loss_positions)},
                     {"out", c.output.out}});
  // --resume and --overwrite say how this start treats --out, not what the run is: left out.
  if (!c.output.init_from.empty()) e.push_back({"init-from", c.output.init_from});
  e.insert(e.end(),
           {{"save-every", config_value(c.output.save_every)},
            {"allow-unverified-checkpoint", config_value(c.output.allow_unverified_checkpoint)},
            {"translate-samples", config_value(c.output.translate_samples)},
            {"log-every", config_value(c.output.log_every)}});
  if (!c.output.profile.empty()) e.push_back({"profile", c.output.profile});
  e.insert(e.end(), {{"profile-steps", config_value(c.output.profile_steps)},
                     {"comm", config_value(c.comm.backend)},
                     {"comm-timeout", config_value(c.comm.timeout_s)}});
  if (program == Program::kDataParallel) {
    e.insert(e.end(), {{"grad-sync", config_value(c.data_parallel.grad_sync)},
                       {"reduce-dtype", config_value(c.data_parallel.reduce_dtype)},
                       {"embedding-sync", config_value(c.data_parallel.embedding_sync)}});
  }
  if (program == Program::kPipeline) {
    e.insert(e.end(), {{"mode", config_value(c.pipeline.mode)},
                       {"schedule", config_value(c.pipeline.schedule)},
                       {"stages-per-rank", config_value(c.pipeline.stages_per_rank)},
                       {"microbatches", config_value(c.pipeline.microbatches)},
                       {"dp", config_value(c.pipeline.dp)},
                       {"zero-bubble", config_value(c.pipeline.zero_bubble)},
                       {"zb-extra-live", config_value(c.pipeline.zb_extra_live)},
                       {"partition", config_value(c.pipeline.partition)}});
  }
  if (program != Program::kSingle) {
    e.insert(e.end(), {{"zero", config_value(c.data_parallel.zero)},
                       {"bucket-mb", config_value(c.data_parallel.bucket_mb)}});
  }
  po::options_description desc;
  TrainConfig scratch;
  add_train_options(desc, scratch, program);
  return cli::to_config_file(e, desc,
                             std::string(program_name(program)) +
                                 " --config FILE runs this configuration again (resolved: the "
                                 "defaults of this machine are written out)");
}

void write_run_config(const TrainConfig& cfg, Program program) {
  write_text_atomically(cfg.output.out + "/" + kRunConfigFile, to_config_file(cfg, program));
}

std::string run_config_of(const std::string& checkpoint) {
  namespace fs = std::filesystem;
  fs::path dir(checkpoint);
  if (dir.filename().empty()) dir = dir.parent_path();  // "runs/dp/checkpoint/"
  std::error_code ec;
  const fs::path file = dir.parent_path() / kRunConfigFile;
  // dp_train's checkpoint has a meta.json, a pipeline's a manifest.json over its stages.
  const bool checkpoint_here =
      fs::is_regular_file(dir / "meta.json", ec) || fs::is_regular_file(dir / "manifest.json", ec);
  if (!checkpoint_here || !fs::is_regular_file(file, ec)) return "";
  return file.string();
}

void check_resume_program(const std::string& checkpoint, Program program) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const bool pipeline = fs::is_regular_file(fs::path(checkpoint) / "manifest.json", ec);
  const bool replicated = fs::is_regular_file(fs::path(checkpoint) / "meta.json", ec);
  const bool mine = program == Program::kPipeline ? !replicated : !pipeline;
  if (mine) return;
  const char* writer = pipeline ? "pp_train's (a pipeline's stages)" : "dp_train's or gpt2_train's";
  const char* other = pipeline ? "pp_train" : "dp_train";
  throw UsageError("--resume " + checkpoint + " is " + writer + " checkpoint, not " +
                   program_name(program) + "'s: continue it with " + other + " --resume " +
                   checkpoint + " (under mpirun, with the ranks of the run that wrote it)");
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
                            argv, vm, [program](const po::variables_map& given) -> std::string {
                              if (given.count("resume") == 0U) return "";
                              const auto& checkpoint = given["resume"].as<std::string>();
                              check_resume_program(checkpoint, program);
                              return run_config_of(checkpoint);
                            });
}

}  // namespace gpt2p::parallel
