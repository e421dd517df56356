// The options of the three trainers (gpt2_train, dp_train, pp_train): one plain value in sections,
// free of the command line (train/flags.h parses it).
// Defaults follow HW5 on GPU (GPT-2 124M, global batch 128, sequence 128, AdamW lr 1e-4, 10 epochs
// over the first 5000 training pairs) and a small embedded default on CPU (the `tiny` preset).
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "gpt2p/comm/backend.h"
#include "gpt2p/compat/attention_choice.h"
#include "gpt2p/core/names.h"
#include "gpt2p/model/options.h"
#include "gpt2p/parallel/data_parallel/sync_options.h"
#include "gpt2p/parallel/train/loss_scaler.h"
#include "gpt2p/pipeline/plan/partition.h"
#include "gpt2p/pipeline/plan/schedule.h"

namespace gpt2p::parallel {

// --device: auto resolves to cuda when this build has CUDA and a GPU is visible, else cpu.
enum class DeviceKind { kAuto, kCpu, kCuda };
constexpr std::array<Named<DeviceKind>, 3> names(DeviceKind) {
  return {{{DeviceKind::kAuto, "auto"}, {DeviceKind::kCpu, "cpu"}, {DeviceKind::kCuda, "cuda"}}};
}

// --mode (pp_train): a pipeline of micro-batches, or the whole batch as one micro-batch through
// the stages in turn (HW5's model-parallel baseline).
enum class PipelineMode { kPipeline, kModelParallel };
constexpr std::array<Named<PipelineMode>, 2> names(PipelineMode) {
  return {
      {{PipelineMode::kPipeline, "pipeline"}, {PipelineMode::kModelParallel, "model_parallel"}}};
}

// --cuda-graphs: auto captures the training step in a CUDA graph where the step allows it (the
// start-up line says whether it does, and why not); off launches every kernel from the host.
enum class CudaGraphs { kAuto, kOff };
constexpr std::array<Named<CudaGraphs>, 2> names(CudaGraphs) {
  return {{{CudaGraphs::kAuto, "auto"}, {CudaGraphs::kOff, "off"}}};
}

// The flags of a trainer, one section per group of its --help (train/flags.h declares them).
// resolve_train_config fills the "-1: by device" defaults and the derived values once: nothing
// downstream re-derives them (the loss scaling's auto, M under model_parallel, the stages per
// rank, the device).
struct TrainConfig {
  struct Model {         // preset plus explicit overrides (-1: the preset's value)
    std::string preset;  // empty: "gpt2" on cuda, "tiny" on cpu
    int n_layer = -1;
    int n_head = -1;
    int n_embd = -1;
    double dropout = -1;
  } model;

  struct Data {
    std::string path = ".cache/data/ding-gpt2.h5";  // --data
    std::string vocab_dir;         // empty: $GPT2P_VOCAB_DIR, else .cache/gpt2-vocab
    int64_t max_train_pairs = -1;  // -1: 5000 on cuda (HW5), 128 on cpu; 0: all
    int64_t max_eval_pairs = -1;   // -1: 256 on cuda, 32 on cpu; 0: all
  } data;

  struct Optim {
    int epochs = -1;          // -1: 10 on cuda, 2 on cpu
    int64_t max_steps = 0;    // 0: no limit
    int64_t batch_size = -1;  // global; -1: 128 on cuda, 16 on cpu
    int64_t seq_len = -1;     // -1: 128 on cuda, 32 on cpu
    int grad_accum = 1;
    double lr = 1e-4;
    double weight_decay = 0.01;
    double grad_clip = 1.0;
    uint64_t seed = 11868;
    int warmup_epochs = 1;  // epochs the analysis drops (recorded, not used by training)
  } optim;

  LossScaleOptions loss_scale;  // train/loss_scaler.h; resolved: kAuto becomes kDynamic or kOff

  struct Compute {
    DeviceKind device = DeviceKind::kAuto;  // resolved: kCpu or kCuda
    model::Precision precision = model::Precision::kFp32;
    model::Kernels kernels = model::Kernels::kAuto;  // a request (model::resolve_kernels)
    compat::Attention attention = compat::Attention::kAuto;
    model::Recompute recompute = model::Recompute::kNone;  // activations backward recomputes
    model::LossPositions loss_positions = model::LossPositions::kTargets;
    CudaGraphs cuda_graphs = CudaGraphs::kAuto;
  } compute;

  struct Output {     // output, checkpoints, evaluation, profiling
    std::string out;  // empty: runs/<program>
    std::string init_from;
    int64_t save_every = 0;  // steps; 0: at the end of every epoch; -1: never
    std::string resume;
    bool allow_unverified_checkpoint = false;  // load a checkpoint whose meta.json has no checksums
    bool overwrite = false;      // a fresh run may replace <out>'s checkpoint and records
    int translate_samples = -1;  // -1: 4 on cuda, 2 on cpu
    int log_every = 10;
    std::string profile;    // a Chrome trace of --profile-steps steps goes here (empty: none)
    int profile_steps = 3;  // steps profiled, after 5 unprofiled ones
  } output;

  struct Comm {
    comm::Backend backend = comm::Backend::kAuto;  // kAuto: NCCL with a GPU per rank
    double timeout_s = 60;  // any wait on a peer (NCCL or MPI) longer than this fails the job
  } comm;

  struct DataParallel {  // dp_train's ranks, pp_train --dp's replicas
    GradSyncMode grad_sync = GradSyncMode::kBucketed;
    double bucket_mb = 25;
    ReduceDtype reduce_dtype = ReduceDtype::kFp32;
    EmbeddingSync embedding_sync = EmbeddingSync::kSparse;  // the tied wte, bucketed only
    int zero = 0;  // ZeRO stage: 1 shards the AdamW state over the data-parallel ranks (zero.h)
  } data_parallel;

  struct Pipeline {
    PipelineMode mode = PipelineMode::kPipeline;
    pipeline::ScheduleKind schedule = pipeline::ScheduleKind::kOneFOneB;
    int microbatches = 4;      // resolved: 1 under --mode model_parallel
    int dp = 1;                // data-parallel replicas of the pipeline (parallel/train/mesh.h)
    bool zero_bubble = false;  // split backward into B and W, W's in the bubbles
    int zb_extra_live = 0;  // micro-batches beyond the base schedule's peak a W may keep (-1: any)
    int stages_per_rank = 0;  // resolved: 0 becomes 2 with --schedule interleaved, else 1
    pipeline::PartitionKind partition = pipeline::PartitionKind::kBalanced;
  } pipeline;
};

enum class Program { kSingle, kDataParallel, kPipeline };
// "gpt2_train", "dp_train" or "pp_train".
const char* program_name(Program p);

// Fills the device-dependent defaults and validates the values (UsageError naming the flag).
// `cuda_available`: whether this build and machine can run on a GPU.
void resolve_train_config(TrainConfig& cfg, Program program, bool cuda_available);

nlohmann::json to_json(const TrainConfig& cfg);

}  // namespace gpt2p::parallel
