#include "gpt2p/parallel/run_context.h"

#include <filesystem>
#include <thread>

#include "gpt2p/core/compat.h"
#include "gpt2p/core/error.h"
#include "gpt2p/model/checkpoint.h"
#include "gpt2p/model/hf_checkpoint.h"

namespace gpt2p::parallel {

RunContext make_run_context(cli::TrainConfig cfg, cli::Program program, const Topology& topo) {
  cli::resolve_train_config(cfg, program, compat::cuda_available());
  auto tokenizer = data::BpeTokenizer::from_dir(cfg.vocab_dir);
  const auto special = data::register_special_tokens(tokenizer);
  RunContext ctx{std::move(cfg), topo,    torch::Device(torch::kCPU), nullptr, nullptr,
                 nullptr,        nullptr, std::move(tokenizer),       special, {}};
  comm::CommOptions copts;
  copts.timeout = std::chrono::milliseconds(static_cast<int64_t>(ctx.cfg.comm_timeout_s * 1000));
  if (ctx.cfg.device == "cuda") {
    const int gpus = static_cast<int>(torch::cuda::device_count());
    GPT2P_CHECK(topo.local_rank < gpus,
                "local rank " << topo.local_rank << " on " << topo.host << " has no GPU of its own ("
                              << gpus << " visible)",
                "start at most one rank per GPU on each node (mpirun -np <GPUs> or --map-by)");
    ctx.device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(topo.local_rank));
    compat::set_current_device(ctx.device);
    copts.backend = comm::Backend::kNccl;
  } else {
    // Ranks sharing a node share its cores.
    const unsigned cores = std::max(1U, std::thread::hardware_concurrency());
    torch::set_num_threads(static_cast<int>(std::max(1U, cores / static_cast<unsigned>(topo.local_size))));
  }
  compat::set_strict_fp32(ctx.cfg.precision == "fp32");
  ctx.comm = comm::make_communicator(copts);
  if (program == cli::Program::kPipeline) ctx.grad_comm = comm::make_communicator(copts);
  if (program == cli::Program::kPipeline && ctx.cfg.stages_per_rank > 1) {
    ctx.act_wrap_comm = comm::make_communicator(copts);
    ctx.grad_wrap_comm = comm::make_communicator(copts);
  }
  ctx.model_config = model_config_for(ctx.cfg, ctx.tokenizer.vocab_size());
  return ctx;
}

model::GPT2Config model_config_for(const cli::TrainConfig& cfg, int64_t vocab_size) {
  auto c = model::preset(cfg.preset);
  if (cfg.n_layer > 0) c.n_layer = cfg.n_layer;
  if (cfg.n_head > 0) c.n_head = cfg.n_head;
  if (cfg.n_embd > 0) c.n_embd = cfg.n_embd;
  if (cfg.dropout >= 0) c.dropout = cfg.dropout;
  c.vocab_size = vocab_size;
  c.n_ctx = std::max(c.n_ctx, cfg.seq_len);
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
  auto mine = torch::tensor({parameter_checksum(model)}, torch::TensorOptions().dtype(torch::kFloat64))
                  .to(comm.device());
  auto all = comm.all_gather(mine).cpu();
  for (int r = 0; r < comm.size(); ++r) {
    GPT2P_CHECK(all[r][0].item<double>() == all[0][0].item<double>(),
                "parameters of rank " << r << " differ from rank 0's " << when << " (checksum "
                                      << all[r][0].item<double>() << " vs " << all[0][0].item<double>() << ")",
                fix);
  }
}

void init_from(model::GPT2& model, const std::string& dir) {
  namespace fs = std::filesystem;
  GPT2P_CHECK(fs::is_directory(dir), "--init-from " << dir << " is not a directory",
              "pass a Hugging Face GPT-2 directory (config.json + model.safetensors) or a checkpoint");
  if (model::is_checkpoint_dir(dir)) {
    model::load_checkpoint(dir, *model, nullptr);
  } else {
    GPT2P_CHECK(model::is_hf_dir(dir), "--init-from " << dir << " holds neither our checkpoint (meta.json) "
                "nor a Hugging Face GPT-2 (config.json + model.safetensors)", "point it at one of those");
    model::import_hf(dir, *model);
  }
}

io::RunIdentity run_identity(const RunContext& ctx, const char* program) {
  io::RunIdentity id;
  id.program = program;
  auto j = cli::to_json(ctx.cfg);
  j["model"] = model::to_json(ctx.model_config);
  j["world_size"] = ctx.topo.size;
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
  auto ce = F::cross_entropy(flat, labels.reshape({-1}), F::CrossEntropyFuncOptions().reduction(torch::kNone));
  const double scale = static_cast<double>(world) / static_cast<double>(std::max<int64_t>(1, global_target_tokens));
  return (ce * mask.reshape({-1}).to(torch::kFloat32)).sum() * scale;
}

}  // namespace gpt2p::parallel
