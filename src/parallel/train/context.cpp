#include "gpt2p/parallel/train/context.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>
#include <thread>

#include "gpt2p/cli/config_agreement.h"
#include "gpt2p/cli/main_guard.h"
#include "gpt2p/cli/options.h"
#include "gpt2p/comm/gpu_placement.h"
#include "gpt2p/compat/attention.h"
#include "gpt2p/compat/device.h"
#include "gpt2p/compat/profiler.h"
#include "gpt2p/core/dir_lock.h"
#include "gpt2p/core/error.h"
#include "gpt2p/core/roll_call.h"
#include "gpt2p/model/checkpoint.h"
#include "gpt2p/model/flops.h"
#include "gpt2p/model/hf_checkpoint.h"
#include "gpt2p/parallel/train/flags.h"
#include "gpt2p/pipeline/plan/schedule.h"

namespace gpt2p::parallel {

namespace {

// What must hold before a run starts, checked on every rank (cli::on_every_rank): --out can be
// written, no other job runs in it (rank 0 takes its lock into `lock`), a fresh run does not
// replace a checkpoint that is already there, and a resume continues a checkpoint in a folder
// that holds no other run.
void check_output(const parallel::TrainConfig& cfg, parallel::Program program, int rank,
                  std::unique_ptr<DirLock>& lock) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(cfg.output.out, ec);
  if (ec || ::access(cfg.output.out.c_str(), W_OK) != 0) {
    throw cli::UsageError("--out " + cfg.output.out + ": cannot write there (" +
                          (ec ? ec.message() : std::string(std::strerror(errno))) +
                          ") -- fix: pass a writable directory");
  }
  if (rank == 0) {
    DirLock::Outcome outcome{};
    std::string detail;
    lock = DirLock::acquire(cfg.output.out, program_name(program), outcome, detail);
    if (outcome == DirLock::Outcome::kBusy) {
      throw cli::UsageError("--out " + cfg.output.out + " is in use by " + detail +
                            " -- fix: wait for that job to end or stop it, or pick another --out");
    }
    if (outcome == DirLock::Outcome::kUnsupported) {
      std::fprintf(stderr,
                   "warning: --out %s: the file system refuses locks (%s), so a second job "
                   "started on this --out would not be refused\n",
                   cfg.output.out.c_str(), detail.c_str());
    }
  }
  if (!fs::is_regular_file(cfg.data.path)) {
    throw cli::UsageError("--data " + cfg.data.path +
                          ": no such file -- fix: make it with prepare_data --out " +
                          cfg.data.path + " (scripts/run does), or pass the dataset's path");
  }
  const std::string checkpoint = cfg.output.out + "/checkpoint";
  if (cfg.output.resume.empty() && !cfg.output.overwrite && fs::exists(checkpoint)) {
    throw cli::UsageError("--out " + cfg.output.out + " already holds a checkpoint (" + checkpoint +
                          ") that this fresh run would replace -- fix: continue it with --resume " +
                          checkpoint + ", start over with --overwrite, or pick another --out");
  }
  if (cfg.output.resume.empty()) return;
  if (!fs::is_directory(cfg.output.resume)) {
    throw cli::UsageError("--resume " + cfg.output.resume +
                          ": no such checkpoint directory -- fix: pass the checkpoint directory a "
                          "run wrote (<out>/checkpoint)");
  }
  const fs::path inner = fs::path(cfg.output.resume) / "checkpoint";
  const fs::path given(cfg.output.resume);
  if (!fs::exists(given / "meta.json") && !fs::exists(given / "manifest.json") &&
      fs::is_directory(inner)) {
    throw cli::UsageError("--resume " + cfg.output.resume +
                          " is a run's folder, not its checkpoint -- fix: did you mean --resume " +
                          inner.string() + "?");
  }
  // A resume writes its steps into --out: not into a folder that holds another run's records.
  const bool same_run = fs::exists(checkpoint) && fs::equivalent(checkpoint, cfg.output.resume, ec);
  if (!same_run && !cfg.output.overwrite) {
    for (const char* record : {"checkpoint", "rank0.h5", kRunConfigFile}) {
      if (!fs::exists(fs::path(cfg.output.out) / record)) continue;
      throw cli::UsageError(
          "--out " + cfg.output.out + " holds another run (" + cfg.output.out + "/" + record +
          ") than the one --resume " + cfg.output.resume +
          " continues -- fix: resume into that run's own folder (leave out --out: the "
          "checkpoint's run names it), pick an empty --out, or pass --overwrite to replace it");
    }
  }
}

// Where this rank computes and how the ranks talk. --device cuda: NCCL (--comm auto or nccl),
// also for ranks that share a GPU (comm/gpu_placement.h: NCCL over sockets, which is faster than
// MPI through host memory: README), or MPI (--comm mpi).
struct Placement {
  torch::Device device{torch::kCPU};
  comm::Backend backend = comm::Backend::kMpi;
  comm::GpuPlacement gpus;
};

Placement place_rank(const parallel::TrainConfig& cfg, const Topology& topo,
                     std::chrono::milliseconds timeout) {
  const bool gpu = cfg.compute.device == parallel::DeviceKind::kCuda;
  cli::on_every_rank(
      [&] {
        if (!gpu && cfg.comm.backend == comm::Backend::kNccl) {
          throw cli::UsageError("--comm nccl needs --device cuda -- fix: use --comm auto or mpi");
        }
        if (gpu && torch::cuda::device_count() < 1) {
          throw cli::UsageError("--device cuda: no GPU is visible on " + topo.host +
                                " -- fix: check CUDA_VISIBLE_DEVICES and nvidia-smi, or use "
                                "--device cpu");
        }
      },
      timeout);
  Placement p;
  if (!gpu) return p;
  p.gpus = comm::place_on_gpus(topo, static_cast<int>(torch::cuda::device_count()),
                               compat::gpu_bus_id, timeout);
  p.device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(p.gpus.gpu));
  p.backend = cfg.comm.backend == comm::Backend::kMpi ? comm::Backend::kMpi : comm::Backend::kNccl;
  if (p.backend == comm::Backend::kNccl) comm::give_nccl_ranks_own_hosts(p.gpus, topo.rank);
  return p;
}

}  // namespace

RunContext make_run_context(parallel::TrainConfig cfg, parallel::Program program,
                            const Topology& topo) {
  std::optional<data::BpeTokenizer> tokenizer;
  Mesh mesh;
  std::unique_ptr<DirLock> out_lock;
  cli::on_every_rank([&] {
    parallel::resolve_train_config(cfg, program, compat::cuda_available());
    // cfg.pipeline.microbatches is resolved: 1 for model parallelism.
    mesh = make_job_mesh(program_name(program), topo.size, topo.rank, cfg.pipeline.dp,
                         cfg.optim.batch_size, cfg.pipeline.microbatches, cfg.data_parallel.zero);
    compat::set_attention_backend(cfg.compute.attention);
    if (!cfg.output.profile.empty()) compat::Profiler::require_available();
    check_output(cfg, program, topo.rank, out_lock);
    tokenizer.emplace(data::BpeTokenizer::from_dir(cfg.data.vocab_dir));
  });
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(cfg.comm.timeout_s * 1000));
  cli::check_same_config(parallel::to_json(cfg), timeout);
  const auto special = data::register_special_tokens(*tokenizer);
  const Placement placement = place_rank(cfg, topo, timeout);
  RunContext ctx{std::move(cfg),
                 topo,
                 mesh,
                 torch::Device(torch::kCPU),
                 {},
                 nullptr,
                 std::move(*tokenizer),
                 special,
                 {},
                 model::Kernels::kReference,
                 torch::kFloat32,
                 {},
                 {},
                 0.0,
                 "comm mpi",
                 std::move(out_lock)};
  comm::CommOptions copts;
  copts.timeout = timeout;
  copts.backend = placement.backend;
  ctx.device = placement.device;
  ctx.comm_description = "comm " + name_string(placement.backend);
  if (const RollCall* roll_call = RollCall::active(); roll_call != nullptr) {
    // Across nodes, the start-up line says where each rank runs.
    const auto& hosts = roll_call->hosts();
    const auto distinct = std::set<std::string>(hosts.begin(), hosts.end()).size();
    if (distinct > 1) {
      ctx.comm_description +=
          " across " + std::to_string(distinct) + " hosts: " + RollCall::describe_placement(hosts);
    }
  }
  if (placement.gpus.job_shares) {
    ctx.comm_description +=
        placement.backend == comm::Backend::kNccl
            ? " over sockets (ranks share GPUs: timings are functional, not speed figures)"
            : " through host memory (ranks share GPUs: timings are functional, not speed figures)";
  }
  if (ctx.device.is_cuda()) {
    compat::set_current_device(ctx.device);
    copts.device = ctx.device;
    if (placement.gpus.host_shares && placement.gpus.lowest_on_host) {
      std::fprintf(stderr,
                   "note: %s: %s, so timings are functional, not speed figures; start one "
                   "rank per GPU to measure speed\n",
                   comm::describe_sharing(placement.gpus, topo.host).c_str(),
                   placement.backend == comm::Backend::kNccl
                       ? "NCCL connects them over sockets, each rank a host of its own"
                       : "they talk over MPI through host memory");
    }
  } else {
    // Ranks sharing a node share its cores.
    const unsigned cores = std::max(1U, std::thread::hardware_concurrency());
    torch::set_num_threads(
        static_cast<int>(std::max(1U, cores / static_cast<unsigned>(topo.local_size))));
  }
  compat::set_strict_fp32(ctx.cfg.compute.precision == model::Precision::kFp32);
  // The mesh's communicators (mesh_comms.h); every rank is here: the placement's timed
  // agreement has just passed.
  std::array<int, kMeshDims> channels{};
  if (program == parallel::Program::kPipeline) {
    // Activations and gradients on streams of their own, so that they never queue behind each
    // other (pipeline/runtime/executor.h); with several stages per rank, two more for the
    // transfers that wrap from the last rank to the first and back.
    channels[static_cast<int>(MeshDim::kPp)] =
        ctx.cfg.pipeline.stages_per_rank > 1 ? pipeline::kNumChannels : 2;
    // The replicas of this rank's stages, over which their gradients are reduced.
    channels[static_cast<int>(MeshDim::kDp)] = mesh.dp() > 1 ? 1 : 0;
  } else {
    channels[static_cast<int>(MeshDim::kDp)] = 1;
  }
  ctx.comms = MeshComms::make(mesh, copts, channels);
  // Host-side control (stop requests, checkpoint commits): MPI on the CPU, whatever the device.
  comm::CommOptions control;
  control.timeout = timeout;
  ctx.control = comm::make_communicator(control);
  ctx.model_config = model_config_for(ctx.cfg, ctx.tokenizer.vocab_size());
  const int capability = compat::compute_capability(ctx.device);
  model::check_precision(ctx.cfg.compute.precision, ctx.device.is_cuda(), capability);
  const model::KernelTarget target{ctx.device.is_cuda(), capability, ctx.cfg.compute.precision};
  ctx.kernels = model::resolve_kernels(ctx.cfg.compute.kernels, target);
  ctx.kernels_fallback = model::kernels_fallback_reason(ctx.cfg.compute.kernels, target);
  ctx.autocast = model::autocast_type(ctx.cfg.compute.precision);
  const auto& mc = ctx.model_config;
  ctx.attention =
      compat::attention_backend(ctx.device, ctx.device.is_cuda() ? ctx.autocast : torch::kFloat32,
                                mc.n_head, ctx.cfg.optim.seq_len, mc.head_dim(), mc.dropout);
  ctx.peak_flops = ctx.device.is_cuda() ? model::peak_flops(compat::device_name(ctx.device),
                                                            ctx.cfg.compute.precision)
                                        : 0.0;
  return ctx;
}

std::string RunContext::describe_kernels() const {
  return comm_description + ", kernels " + name_string(kernels) +
         (kernels_fallback.empty() ? "" : " (" + kernels_fallback + ")") + ", attention " +
         attention;
}

void open_train_data(const RunContext& ctx, int rank, int world, std::optional<TrainData>& data) {
  const auto& cfg = ctx.cfg;
  cli::on_every_rank(
      [&] {
        data.emplace(TrainDataOptions{cfg.data.path, ctx.tokenizer.identity(),
                                      ctx.tokenizer.vocab_size(), cfg.data.max_train_pairs,
                                      cfg.optim.batch_size, cfg.optim.seq_len, cfg.optim.seed},
                     rank, world);
      },
      ctx.checkpoint_timeout());
}

model::GPT2Config model_config_for(const parallel::TrainConfig& cfg, int64_t vocab_size) {
  auto c = model::preset(cfg.model.preset);
  if (cfg.model.n_layer > 0) c.n_layer = cfg.model.n_layer;
  if (cfg.model.n_head > 0) c.n_head = cfg.model.n_head;
  if (cfg.model.n_embd > 0) c.n_embd = cfg.model.n_embd;
  if (cfg.model.dropout >= 0) c.dropout = cfg.model.dropout;
  c.vocab_size = vocab_size;
  c.n_ctx = std::max(c.n_ctx, cfg.optim.seq_len);
  c.validate();
  return c;
}

double parameter_checksum(model::GPT2& model) {
  torch::NoGradGuard no_grad;
  double sum = 0;
  int64_t i = 0;
  for (const auto& p : model->parameters()) {
    // Position-weighted, so swapped or shifted values change it too.
    auto flat = p.detach().to(torch::kFloat64).reshape({-1});
    auto w = torch::arange(1, flat.numel() + 1, flat.options()).remainder(97.0) + 1.0;
    sum += (flat * w).sum().item<double>() * static_cast<double>(++i);
  }
  return sum;
}

void broadcast_parameters(model::GPT2& model, comm::Communicator& comm) {
  torch::NoGradGuard no_grad;
  for (auto& p : model->parameters()) {
    auto data = p.detach();
    comm.broadcast(data, 0);
  }
  check_replicas(model, comm, "after the broadcast",
                 "all ranks must build the same model (same --preset and overrides)");
}

void check_replicas(model::GPT2& model, comm::Communicator& comm, const std::string& when,
                    const std::string& fix) {
  auto mine =
      torch::tensor({parameter_checksum(model)}, torch::TensorOptions().dtype(torch::kFloat64))
          .to(comm.device());
  auto all = comm.all_gather(mine).cpu();
  for (int r = 0; r < comm.size(); ++r) {
    GPT2P_CHECK(all[r][0].item<double>() == all[0][0].item<double>(),
                "parameters of rank " << r << " differ from rank 0's " << when << " (checksum "
                                      << all[r][0].item<double>() << " vs "
                                      << all[0][0].item<double>() << ")",
                fix);
  }
}

void init_from(model::GPT2& model, const std::string& dir, bool allow_unverified) {
  namespace fs = std::filesystem;
  GPT2P_CHECK(
      fs::is_directory(dir), "--init-from " << dir << " is not a directory",
      "pass a Hugging Face GPT-2 directory (config.json + model.safetensors) or a checkpoint");
  if (model::is_checkpoint_dir(dir)) {
    model::load_checkpoint(dir, *model, nullptr, {allow_unverified});
  } else {
    GPT2P_CHECK(model::is_hf_dir(dir),
                "--init-from " << dir
                               << " holds neither our checkpoint (meta.json) "
                                  "nor a Hugging Face GPT-2 (config.json + model.safetensors)",
                "point it at one of those");
    model::import_hf(dir, *model);
  }
}

model::GPT2 make_model(const RunContext& ctx, const std::optional<model::LayerRange>& range) {
  const auto& cfg = ctx.cfg;
  auto model = range ? model::GPT2(ctx.model_config, *range) : model::GPT2(ctx.model_config);
  model->reset_parameters(cfg.optim.seed);
  if (!cfg.output.init_from.empty()) {
    cli::on_every_rank(
        [&] { init_from(model, cfg.output.init_from, cfg.output.allow_unverified_checkpoint); },
        ctx.checkpoint_timeout());
  }
  model->to(ctx.device);
  model->set_kernels(ctx.kernels);
  model->set_recompute(cfg.compute.recompute);
  return model;
}

std::unique_ptr<compat::FusedAdamW> make_adamw(const TrainConfig& cfg,
                                               std::vector<torch::Tensor> params) {
  return std::make_unique<compat::FusedAdamW>(
      std::move(params),
      torch::optim::AdamWOptions(cfg.optim.lr).weight_decay(cfg.optim.weight_decay));
}

io::RunIdentity run_identity(const RunContext& ctx, const char* program) {
  io::RunIdentity id;
  id.program = program;
  auto j = parallel::to_json(ctx.cfg);
  j["model"] = model::to_json(ctx.model_config);
  j["world_size"] = ctx.topo.size;
  j["comm_backend"] = ctx.step_comm().backend_name();
  j["comm_description"] = ctx.comm_description;
  id.config_json = j.dump();
  id.host = ctx.topo.host;
  id.device = ctx.device.str();
  id.gpu_name = compat::device_name(ctx.device);
  id.world_size = ctx.topo.size;
  id.rank = ctx.topo.rank;
  return id;
}

torch::Tensor scaled_loss(const torch::Tensor& logits, const torch::Tensor& labels,
                          const torch::Tensor& mask, int64_t vocab_size,
                          int64_t global_target_tokens, int world) {
  namespace F = torch::nn::functional;
  auto flat = logits.narrow(-1, 0, vocab_size).reshape({-1, vocab_size}).to(torch::kFloat32);
  auto ce = F::cross_entropy(flat, labels.reshape({-1}),
                             F::CrossEntropyFuncOptions().reduction(torch::kNone));
  const double scale =
      static_cast<double>(world) / static_cast<double>(std::max<int64_t>(1, global_target_tokens));
  return (ce * mask.reshape({-1}).to(torch::kFloat32)).sum() * scale;
}

}  // namespace gpt2p::parallel
