// The flags of the three trainers (gpt2_train, dp_train, pp_train), parsed into one plain value.
// Defaults follow HW5 on GPU (GPT-2 124M, global batch 128, sequence 128, AdamW lr 1e-4, 10 epochs
// over the first 5000 training pairs) and a small embedded default on CPU (the `tiny` preset).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "gpt2p/cli/options.h"

namespace gpt2p::cli {

struct TrainConfig {
  // Model: preset plus explicit overrides (-1 = take the preset's value).
  std::string preset;  // empty: "gpt2" on cuda, "tiny" on cpu
  int n_layer = -1;
  int n_head = -1;
  int n_embd = -1;
  double dropout = -1;

  // Data.
  std::string data = ".cache/data/ding-gpt2.h5";
  std::string vocab_dir;  // empty: $GPT2P_VOCAB_DIR, else .cache/gpt2-vocab
  int64_t max_train_pairs = -1;  // -1: 5000 on cuda (HW5), 128 on cpu; 0: all
  int64_t max_eval_pairs = -1;   // -1: 256 on cuda, 32 on cpu; 0: all

  // Optimisation.
  int epochs = -1;             // -1: 10 on cuda, 2 on cpu
  int64_t max_steps = 0;       // 0: no limit
  int64_t batch_size = -1;     // global; -1: 128 on cuda, 16 on cpu
  int64_t seq_len = -1;        // -1: 128 on cuda, 32 on cpu
  int grad_accum = 1;
  double lr = 1e-4;
  double weight_decay = 0.01;
  double grad_clip = 1.0;
  std::string precision = "fp32";  // fp32 | tf32 | bf16
  std::string loss_positions = "targets";  // targets | all (model/lm_head_loss.h)
  std::string device = "auto";     // auto | cpu | cuda
  std::string kernels = "auto";    // auto | fused | reference (model/lm_head_loss.h)
  std::string attention = "auto";  // auto | flash | cudnn | efficient | math (core/compat.h)
  uint64_t seed = 11868;
  int warmup_epochs = 1;  // epochs the analysis drops (recorded, not used by training)

  // Output, checkpoints, evaluation.
  std::string out;  // empty: runs/<program>
  std::string init_from;
  int64_t save_every = 0;  // steps; 0: at the end of every epoch; -1: never
  std::string resume;
  int translate_samples = -1;  // -1: 4 on cuda, 2 on cpu
  int log_every = 10;
  std::string profile;     // a Chrome trace of --profile-steps steps goes here (empty: none)
  int profile_steps = 3;   // steps profiled, after 5 unprofiled ones
  double comm_timeout_s = 60;  // any wait on a peer (NCCL or MPI) longer than this fails the job
  std::string comm = "auto";   // auto | nccl | mpi (auto: nccl when every rank has its own GPU)
  bool overwrite = false;      // a fresh run may replace <out>'s checkpoint and records

  // Data parallel.
  std::string grad_sync = "bucketed";  // per-param | bucketed
  double bucket_mb = 25;
  std::string reduce_dtype = "fp32";  // fp32 | bf16
  std::string embedding_sync = "sparse";  // sparse | dense (the tied wte, bucketed only)

  // Pipeline parallel.
  std::string mode = "pipeline";  // pipeline | model_parallel
  std::string schedule = "1f1b";  // gpipe | 1f1b | interleaved
  int microbatches = 4;
  bool zero_bubble = false;  // split backward into B and W, W's in the bubbles
  int zb_extra_live = 0;     // micro-batches beyond the base schedule's peak a W may keep (-1: any)
  int stages_per_rank = 0;             // 0: 2 with --schedule interleaved, else 1
  std::string partition = "balanced";  // uniform | balanced | measured
};

enum class Program { kSingle, kDataParallel, kPipeline };

// Declares every flag of `program` on `desc`, bound to fields of `cfg`.
void add_train_options(po::options_description& desc, TrainConfig& cfg, Program program);

// Fills the device-dependent defaults and validates the values (UsageError naming the flag).
// `cuda_available`: whether this build and machine can run on a GPU.
void resolve_train_config(TrainConfig& cfg, Program program, bool cuda_available);

nlohmann::json to_json(const TrainConfig& cfg);

// Parses argv; returns false after --help.
bool parse_train_args(TrainConfig& cfg, Program program, int argc, char** argv);

}  // namespace gpt2p::cli
