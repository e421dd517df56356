#include "gpt2p/parallel/train/flags.h"

#include <filesystem>

#include "gpt2p/cli/flag_table.h"
#include "gpt2p/core/atomic_file.h"
#include "gpt2p/model/checkpoint_kind.h"

namespace gpt2p::parallel {

namespace {

using cli::Allowed;
using cli::UsageError;

// A flag's help: the names of E (the one table of its spellings), then `rest`.
template <class E>
std::string help(const char* rest) {
  return choices<E>() + rest;
}

template <class T>
Allowed<T> positive() {
  return {[](T v) { return v > 0; }, "a value > 0"};
}

template <class T>
Allowed<T> non_negative(const char* range = "a value >= 0") {
  return {[](T v) { return v >= 0; }, range};
}

Allowed<int> zero_stage() {
  return {[](int z) { return z == 0 || z == 1; }, "0 or 1"};
}

// The flags of `program`, bound to fields of `c`, one flag a line, so a diff shows the flag it
// changes. A flag is written to the config file with its field's value unless its line says
// otherwise: the model overrides hold -1 for "the preset's value", which their checks refuse, and
// the optional paths "" for none.
// clang-format off
void declare_flags(cli::FlagTable& t, TrainConfig& c, Program program) {
  t.section("Model");
  t.value("preset", c.model.preset, "tiny | gpt2 | gpt2-medium | gpt2-large | gpt2-xl (default: gpt2 on cuda, tiny on cpu)");
  t.value("n-layer", c.model.n_layer, "override: number of transformer blocks").check(positive<int>()).written_unless(-1);
  t.value("n-head", c.model.n_head, "override: attention heads").check(positive<int>()).written_unless(-1);
  t.value("n-embd", c.model.n_embd, "override: model width").check(positive<int>()).written_unless(-1);
  t.value("dropout", c.model.dropout, "override: dropout probability (preset: 0.1)").check({[](double p) { return p >= 0 && p < 1; }, "a probability in [0, 1)"}).written_unless(-1);
  t.section("Data");
  t.value("data", c.data.path, "prepared dataset (HDF5, from prepare_data)").with_default();
  t.value("vocab-dir", c.data.vocab_dir, "GPT-2 vocabulary (encoder.json + vocab.bpe, or vocab.json + merges.txt); default $GPT2P_VOCAB_DIR or .cache/gpt2-vocab");
  t.value("max-train-pairs", c.data.max_train_pairs, "use the first N training pairs; 0 = all (default: 5000 on cuda as HW5, 128 on cpu)").check(non_negative<int64_t>("a count >= 0 (0 = all)"));
  t.value("max-eval-pairs", c.data.max_eval_pairs, "validation pairs evaluated per epoch; 0 = all (default: 256 on cuda, 32 on cpu)").check(non_negative<int64_t>("a count >= 0 (0 = all)"));
  t.section("Optimisation");
  t.value("epochs", c.optim.epochs, "passes over the training pairs (default: 10 on cuda, 2 on cpu)").check(positive<int>());
  t.value("max-steps", c.optim.max_steps, "stop after this many optimizer steps; 0 = no limit").with_default();
  t.value("batch-size", c.optim.batch_size, "GLOBAL batch in sequences per optimizer step (default: 128 on cuda, 16 on cpu)").check(positive<int64_t>());
  t.value("seq-len", c.optim.seq_len, "tokens per sequence, max_len of HW5 (default: 128 on cuda, 32 on cpu)").check({[](int64_t n) { return n >= 2; }, "a length >= 2"});
  t.value("grad-accum", c.optim.grad_accum, "micro-steps accumulated per optimizer step").with_default();
  t.value("lr", c.optim.lr, "AdamW learning rate").with_default();
  t.value("weight-decay", c.optim.weight_decay, "AdamW weight decay").with_default().check(non_negative<double>());
  t.value("grad-clip", c.optim.grad_clip, "clip the global gradient norm to this; 0 = off").with_default().check(non_negative<double>("a norm >= 0 (0 = off)"));
  t.value("seed", c.optim.seed, "seed for initialisation, shuffling and dropout").with_default();
  t.value("warmup-epochs", c.optim.warmup_epochs, "epochs the analysis drops as warm-up (recorded in the output)").with_default().check(non_negative<int>());
  t.section("Loss scaling");
  t.named("loss-scale", c.loss_scale.mode, help<LossScaleMode>(": dynamic loss scaling (the loss times a scale S, the gradients divided by S before clipping; a step whose gradients overflow is skipped and S halved, S doubled after --loss-scale-window good steps); auto = dynamic with --precision fp16"));
  t.value("loss-scale-init", c.loss_scale.init, "the first loss scale (a power of two keeps the scaling exact)").with_default().check({[](double s) { return s >= 1.0 / 1024 && s <= 16777216.0; }, "a scale in [2^-10, 2^24]"});
  t.value("loss-scale-window", c.loss_scale.window, "good steps in a row after which the loss scale doubles").with_default().check(positive<int64_t>());
  t.section("Compute");
  t.named("device", c.compute.device, help<DeviceKind>(" (auto: cuda when built with CUDA and a GPU is present)"));
  t.named("precision", c.compute.precision, help<model::Precision>(": fp32, TF32 matmuls, or autocast to bf16 (A100/H100/H200, CPU) or fp16 (CUDA GPUs; with dynamic loss scaling: a V100's half type)"));
  t.named("kernels", c.compute.kernels, help<model::Kernels>(": the LM head's softmax and cross-entropy by the project's CUDA kernels (fused) or ATen ops (reference); auto = fused on CUDA"));
  t.named("attention", c.compute.attention, help<compat::Attention>(": the kernels scaled_dot_product_attention may use (auto: all, torch's choice); the start-up line names the one that runs"));
  t.named("recompute", c.compute.recompute, "none (keep every activation for backward) | blocks (keep each transformer block's input only and run the block again in backward, with the same dropout: activation memory of about one block per micro-batch, for about one more forward of the blocks)");
  t.named("cuda-graphs", c.compute.cuda_graphs, help<CudaGraphs>(": auto = capture each training step in a CUDA graph and launch it with one call where the step allows it (one rank per model part, no dynamic loss scaling, --loss-positions all; the start-up line says which), off = launch every kernel from the host"));
  t.named("loss-positions", c.compute.loss_positions, "targets (the LM head and its cross-entropy run only where the loss mask counts: same loss and gradients, a fraction of the head's work) | all (every position, as a plain head)");
  t.section("Output");
  t.value("out", c.output.out, "output directory: rank<r>.h5 timing files, checkpoints (default: runs/<program>)");
  t.value("init-from", c.output.init_from, "initialise from a Hugging Face GPT-2 directory or one of our checkpoints").written_unless("");
  t.value("save-every", c.output.save_every, "checkpoint every N optimizer steps; 0 = at the end of each epoch; -1 = never (benchmarks)").with_default();
  // --resume and --overwrite say how one start treats --out, not what the run is: not written.
  t.value("resume", c.output.resume, "resume from this checkpoint directory (model, optimizer, step, RNG, data position)").not_written();
  t.flag("allow-unverified-checkpoint", c.output.allow_unverified_checkpoint, "load a --resume or --init-from checkpoint whose meta.json lists no checksums (refused without it), with a warning");
  t.flag("overwrite", c.output.overwrite, "let a fresh run replace the checkpoint and rank files already in --out (without it such a run is refused)").not_written();
  t.value("translate-samples", c.output.translate_samples, "test pairs greedily translated (and BLEU-scored) per epoch (default: 4 on cuda, 2 on cpu)").check(non_negative<int>("a count >= 0 (0 = none)"));
  t.value("log-every", c.output.log_every, "rank 0 prints a progress line every N steps").with_default().check(positive<int>());
  t.value("profile", c.output.profile, "write a Chrome trace of every rank's operators and CUDA kernels (libtorch's profiler) to DIR/trace_rank<r>.json, for --profile-steps steps after 5 others; analysis/kernel_table.py sums it per kernel").written_unless("");
  t.value("profile-steps", c.output.profile_steps, "steps --profile records").with_default().check(positive<int>());
  t.section("Communication");
  t.named("comm", c.comm.backend, help<gpt2p::comm::Backend>(": how ranks talk; auto = nccl when every rank has a GPU of its own, else mpi (CUDA tensors staged through host memory: for development on one GPU, timings not meaningful)"));
  t.value("comm-timeout", c.comm.timeout_s, "seconds a rank waits on a peer (a collective or a transfer, NCCL or MPI) before failing the job").with_default();
  if (program == Program::kDataParallel) {
    t.section("Data parallel");
    t.named("grad-sync", c.data_parallel.grad_sync, "per-param (one all_reduce per parameter, HW5) | bucketed (overlapped with backward)");
    t.value("bucket-mb", c.data_parallel.bucket_mb, "bucket size in MiB for --grad-sync bucketed").with_default().check(positive<double>());
    t.named("reduce-dtype", c.data_parallel.reduce_dtype, help<ReduceDtype>(": dtype gradients travel in"));
    t.named("embedding-sync", c.data_parallel.embedding_sync, "the tied wte under --grad-sync bucketed: sparse (the head's part reduced as soon as backward starts, the token lookup's B*T gradient rows all-gathered) | dense (one 50k-row all_reduce after backward)");
    t.value("zero", c.data_parallel.zero, "ZeRO stage: 1 = shard the AdamW state over the ranks (each keeps 1/N of it; gradients reduce-scattered in --bucket-mb buckets during backward, parameters all-gathered after the step); 0 = every rank keeps all of it").with_default().check(zero_stage());
  }
  if (program == Program::kPipeline) {
    t.section("Pipeline parallel");
    t.named("mode", c.pipeline.mode, help<PipelineMode>(" (whole batch as one micro-batch, HW5's baseline)"));
    t.named("schedule", c.pipeline.schedule, help<pipeline::ScheduleKind>(" (1F1B over --stages-per-rank stages per rank, Megatron's virtual pipeline: a smaller bubble at the same micro-batch size; --microbatches a multiple of the ranks)"));
    t.value("stages-per-rank", c.pipeline.stages_per_rank, "stages each rank holds, rank r the stages r, r + ranks, ...: 1 for " + pipeline::schedule_names(false) + ", >= 2 for " + pipeline::schedule_names(true) + " (0 = 2 there)").with_default();
    t.value("microbatches", c.pipeline.microbatches, "micro-batches per step (HW5's n_chunk); must divide --batch-size (with --dp D: a replica's batch, --batch-size / D)").with_default();
    t.value("dp", c.pipeline.dp, "data-parallel replicas of the pipeline: mpirun -np D*P pp_train --dp D runs D pipelines of P ranks (ranks d*P .. d*P+P-1 are replica d), each on its share of the batch, their gradients averaged per stage").with_default().check(positive<int>());
    t.flag("zero-bubble", c.pipeline.zero_bubble, "split every backward into B (the input gradient the previous stage waits for) and W (the weight gradients), and run the W's in the schedule's bubbles (Zero Bubble Pipeline Parallelism, Qi et al. 2024); any --schedule");
    t.value("zb-extra-live", c.pipeline.zb_extra_live, "with --zero-bubble: micro-batches a rank may keep alive beyond the peak of the schedule without it, so that their W's can wait longer for a bubble (a waiting W keeps its blocks' linear inputs and output gradients). 0 = the memory of the schedule without --zero-bubble (ZB-H1); -1 = no limit").with_default();
    t.named("partition", c.pipeline.partition, "uniform (HW5: ceil(blocks/stages) each) | balanced (FLOP cost model) | measured (balanced by layer times rank 0 measures on its device before training); --resume keeps the checkpoint's split");
    t.value("zero", c.data_parallel.zero, "with --dp D >= 2: ZeRO stage 1, each stage's AdamW state sharded over its D replicas (gradients reduce-scattered after the schedule, parameters all-gathered after the step); 0 = not sharded").with_default().check(zero_stage());
    t.value("bucket-mb", c.data_parallel.bucket_mb, "with --dp D >= 2: size in MiB of the buckets the replicas' gradients are reduced in").with_default().check(positive<double>());
  }
}
// clang-format on

}  // namespace

void add_train_options(po::options_description& desc, TrainConfig& c, Program program) {
  cli::FlagTable t;
  declare_flags(t, c, program);
  t.add_to(desc);
}

std::string to_config_file(const TrainConfig& c, Program program) {
  TrainConfig copy = c;  // the table binds the flags to fields it could set: a copy's
  cli::FlagTable t;
  declare_flags(t, copy, program);
  return t.config_file(std::string(program_name(program)) +
                       " --config FILE runs this configuration again (resolved: the defaults of "
                       "this machine are written out)");
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
  const bool checkpoint_here = model::checkpoint_kind(dir.string()) != model::CheckpointKind::kNone;
  if (!checkpoint_here || !fs::is_regular_file(file, ec)) return "";
  return file.string();
}

void check_resume_program(const std::string& checkpoint, Program program) {
  using model::CheckpointKind;
  const CheckpointKind kind = model::checkpoint_kind(checkpoint);
  const CheckpointKind others =
      program == Program::kPipeline ? CheckpointKind::kReplicated : CheckpointKind::kPipeline;
  if (kind != others) return;
  const bool pipeline = kind == CheckpointKind::kPipeline;
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
