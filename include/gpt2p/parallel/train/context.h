// What every trainer sets up the same way before its first step: device, communicator,
// tokenizer, model shape, output file identity.
#pragma once

#include <torch/types.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "gpt2p/comm/communicator.h"
#include "gpt2p/compat/adamw.h"
#include "gpt2p/core/dir_lock.h"
#include "gpt2p/data/bpe_tokenizer.h"
#include "gpt2p/data/special_tokens.h"
#include "gpt2p/io/run_record.h"
#include "gpt2p/model/config.h"
#include "gpt2p/model/gpt2.h"
#include "gpt2p/parallel/train/data.h"
#include "gpt2p/parallel/train/mesh.h"
#include "gpt2p/parallel/train/mesh_comms.h"
#include "gpt2p/parallel/train/options.h"

namespace gpt2p::parallel {

struct RunContext {
  parallel::TrainConfig cfg;
  Topology topo;
  // This rank's place in the job's grid (train/mesh.h): dp_train and gpt2_train are "dp" over
  // every rank; pp_train is "dp-pp" (--dp D replicas of a P-rank pipeline).
  Mesh mesh;
  torch::Device device{torch::kCPU};
  // The mesh's communicators (train/mesh_comms.h): NCCL on cuda (also for ranks that share a GPU:
  // comm/gpu_placement.h), MPI on cpu and with --comm mpi. dp_train: one along dp. pp_train: the
  // four channels of pipeline/plan/schedule.h along pp (the two wrapping ones only with several
  // stages per rank), and one along dp with --dp > 1.
  MeshComms comms;
  // The communicator the loop steps with (its start barrier and the barriers after evaluation):
  // the mesh's innermost dimension's first.
  comm::Communicator& step_comm() const { return *comms.along(mesh.innermost()); }
  // MPI over CPU tensors, for the host's decisions: stop requests, checkpoint commits.
  std::unique_ptr<comm::Communicator> control;
  data::BpeTokenizer tokenizer;
  // --comm-timeout, for waits of the ranks' own agreements (cli::on_every_rank).
  std::chrono::milliseconds control_timeout() const {
    return std::chrono::milliseconds(static_cast<int64_t>(cfg.comm.timeout_s * 1000));
  }
  // For agreements around checkpoint writes and reads, where the other ranks wait while one
  // writes gigabytes (to a network file system, say): 10x --comm-timeout, at least 15 minutes.
  std::chrono::milliseconds checkpoint_timeout() const {
    return std::max(10 * control_timeout(), std::chrono::milliseconds(15 * 60 * 1000));
  }
  data::SpecialTokens special;
  model::GPT2Config model_config;
  // How the head's loss runs (--kernels, resolved), the attention kernel that runs (--attention,
  // as torch's dispatcher answers for this run's shapes), and one GPU's peak FLOP/s at
  // --precision (0 on the CPU or an unknown GPU: no MFU).
  model::Kernels kernels = model::Kernels::kReference;
  // The type forward autocasts to at --precision (model::autocast_type; kFloat32: none).
  torch::ScalarType autocast = torch::kFloat32;
  // Why --kernels auto chose the reference kernels on this GPU (model::kernels_fallback_reason).
  std::string kernels_fallback;
  std::string attention;
  double peak_flops = 0;
  // "comm nccl", or "comm nccl over sockets (ranks share GPUs: ...)": what moves the tensors.
  std::string comm_description = "comm mpi";
  // "comm nccl, kernels fused, attention flash", or "..., kernels reference (sm_70 is older than
  // the fused kernels' sm_80), ...": for the start-up line.
  std::string describe_kernels() const;
  // Rank 0: the lock on --out, held while the run lives (core/dir_lock.h); null elsewhere.
  std::unique_ptr<DirLock> out_lock;
};

// Resolves the config (device defaults, validation), checks --out and --resume, loads the
// tokenizer, checks that every rank runs the same configuration (all of it on every rank, ending
// the job with one message and exit 2 on a problem: cli/main_guard.h), picks this rank's GPU
// (local rank) and backend (--comm), limits CPU threads to this rank's share of the cores and
// makes the communicators.
RunContext make_run_context(parallel::TrainConfig cfg, parallel::Program program,
                            const Topology& topo);

// Opens the run's training data as data rank `rank` of `world` into `data`, on every rank as an
// agreed check (cli::on_every_rank): a dataset every rank rejects is reported once.
void open_train_data(const RunContext& ctx, int rank, int world, std::optional<TrainData>& data);

// Preset + overrides, vocabulary = the tokenizer's (GPT-2 + 3 specials), context >= --seq-len.
model::GPT2Config model_config_for(const parallel::TrainConfig& cfg, int64_t vocab_size);

// Broadcasts every parameter from rank 0, then checks that all ranks hold the same values
// (a float64 checksum all-gathered); throws naming the first rank that differs.
void broadcast_parameters(model::GPT2& model, comm::Communicator& comm);
// Throws unless every rank's parameters have rank 0's checksum; the message says `when` and `fix`.
void check_replicas(model::GPT2& model, comm::Communicator& comm, const std::string& when,
                    const std::string& fix);
double parameter_checksum(model::GPT2& model);

// Loads --init-from (a Hugging Face GPT-2 directory or one of our checkpoints) into `model`.
void init_from(model::GPT2& model, const std::string& dir, bool allow_unverified);

// The model as every trainer starts it -- the whole one, or the layers `range` of it (a pipeline
// stage): weights from --seed, then --init-from (agreed on every rank), on the run's device with
// its kernels and --recompute.
model::GPT2 make_model(const RunContext& ctx,
                       const std::optional<model::LayerRange>& range = std::nullopt);
// AdamW at --lr and --weight-decay over `params`: the optimizer every trainer starts with (a
// GradReducer takes it over: data_parallel/reducer.h).
std::unique_ptr<compat::FusedAdamW> make_adamw(const TrainConfig& cfg,
                                               std::vector<torch::Tensor> params);

io::RunIdentity run_identity(const RunContext& ctx, const char* program);

// Sum of the masked cross-entropy scaled so that averaging gradients over `world` ranks gives the
// gradient of the mean over the global batch's `global_target_tokens` (see train/data.h), from
// full logits. The trainers compute the same loss with GPT2::loss (the head at the target
// positions only, model/lm_head_loss.h); this is the plain computation the tests compare it with.
torch::Tensor scaled_loss(const torch::Tensor& logits, const torch::Tensor& labels,
                          const torch::Tensor& mask, int64_t vocab_size,
                          int64_t global_target_tokens, int world);

}  // namespace gpt2p::parallel
