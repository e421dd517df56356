// The pipeline on GPUs as pp_train runs it, over NCCL (ranks sharing one GPU: over sockets, each
// rank a host of its own to NCCL): one communicator per channel (activations,
// gradients, and the two wrap channels of the interleaved schedule). For GPipe, 1F1B and the
// interleaved schedule (2 stages per rank), the loss and every parameter's gradient equal the whole
// model's on the same batch, computed on the same GPU. tests/mpi/test_pp.cpp checks the same on
// CPU ranks over MPI, whose calls never block; this one runs the ordered NCCL streams.
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gpt2p/comm/communicator.h"
#include "gpt2p/comm/gpu_placement.h"
#include "gpt2p/compat/device.h"
#include "gpt2p/compat/rng.h"
#include "gpt2p/parallel/data_parallel/replica_grad_sync.h"
#include "gpt2p/parallel/train/context.h"
#include "gpt2p/parallel/trainers/pp_trainer.h"
#include "gpt2p/pipeline/plan/zero_bubble.h"
#include "gpt2p/pipeline/runtime/executor.h"
#include "support/small_model.h"

namespace gpt2p {
namespace {

constexpr int64_t kRows = 8, kSeq = 16;
constexpr uint64_t kSeed = 99;

// 8 blocks (2 ranks x 2 stages fit with room), no dropout, a small vocabulary.
model::GPT2Config small_config() { return gpt2p::testing::small_model(8, 500); }

class PipelineGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    const int gpus = static_cast<int>(torch::cuda::device_count());
    if (gpus < 1) GTEST_SKIP() << "needs a GPU";
    // NCCL, as pp_train's --comm auto picks on GPUs: ranks that share a GPU get NCCL host ids of
    // their own (comm/gpu_placement.h) and talk over sockets.
    const auto topo = query_topology(MPI_COMM_WORLD);
    const auto placement =
        comm::place_on_gpus(topo, gpus, compat::gpu_bus_id, std::chrono::milliseconds(60000));
    comm::give_nccl_ranks_own_hosts(placement, topo.rank);
    comm::CommOptions options;
    options.backend = comm::Backend::kNccl;
    options.device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(placement.gpu));
    compat::set_current_device(options.device);
    for (auto& c : comms) c = comm::make_communicator(options);
    if (comms[0]->size() < 2) GTEST_SKIP() << "needs 2 ranks";
    device = comms[0]->device();
    compat::set_strict_fp32(true);  // no TF32: the comparison is against fp32 sums
  }

  // The same batch on every rank, on this rank's GPU.
  pipeline::StageBatch batch(int64_t vocab) const {
    auto gen = compat::make_cpu_generator(kSeed);
    pipeline::StageBatch b;
    b.inputs = torch::randint(vocab, {kRows, kSeq}, gen, torch::kInt64).to(device);
    b.labels = torch::randint(vocab, {kRows, kSeq}, gen, torch::kInt64).to(device);
    b.mask = (torch::rand({kRows, kSeq}, gen) > 0.3).to(torch::kFloat32).to(device);
    b.global_target_tokens = static_cast<int64_t>(b.mask.sum().item<double>());
    return b;
  }

  std::unique_ptr<comm::Communicator> comms[pipeline::kNumChannels];
  torch::Device device{torch::kCPU};
};

TEST_F(PipelineGpu, EverySchedulesLossAndGradientsMatchTheWholeModel) {
  const auto config = small_config();
  const auto b = batch(config.vocab_size);
  model::GPT2 full(config);
  full->reset_parameters(kSeed);
  full->to(device);
  auto ref_loss = parallel::scaled_loss(full->forward(b.inputs), b.labels, b.mask,
                                        config.vocab_size, b.global_target_tokens, 1);
  ref_loss.backward();
  const double want_loss = ref_loss.item<double>();
  std::map<std::string, torch::Tensor> ref;
  for (const auto& p : full->named_parameters()) ref[p.key()] = p.value().grad().cpu();

  const int n = comms[0]->size(), rank = comms[0]->rank();
  pipeline::CommTransport transport(*comms[0], *comms[1], comms[2].get(), comms[3].get());
  // lookup_per_step: the first stage sums the token lookup's gradient once per step
  // (GptStage::sum_lookup_grads_per_step, as pp_train without replicas), else autograd's per
  // micro-batch.
  struct Case {
    pipeline::ScheduleKind kind;
    int per_rank, m;
    bool zero_bubble = false;
    bool lookup_per_step = true;
  };
  const Case cases[] = {{pipeline::ScheduleKind::kGPipe, 1, 4},
                        {pipeline::ScheduleKind::kGPipe, 1, 4, false, false},
                        {pipeline::ScheduleKind::kOneFOneB, 1, 4},
                        {pipeline::ScheduleKind::kOneFOneB, 1, 4, false, false},
                        {pipeline::ScheduleKind::kInterleaved, 2, 2 * n},
                        {pipeline::ScheduleKind::kInterleaved, 2, 4 * n},
                        {pipeline::ScheduleKind::kOneFOneB, 1, 4, true},
                        {pipeline::ScheduleKind::kInterleaved, 2, 2 * n, true}};
  for (const auto& c : cases) {
    if (kRows % c.m != 0) continue;
    SCOPED_TRACE(pipeline::to_string(c.kind) + " x" + std::to_string(c.per_rank) +
                 " M=" + std::to_string(c.m) + (c.zero_bubble ? " zero-bubble" : "") +
                 (c.lookup_per_step ? " lookup per step" : " lookup per micro-batch"));
    const auto split = parallel::stage_partition(pipeline::PartitionKind::kBalanced, config,
                                                 n * c.per_rank, kSeq, {}, c.per_rank);
    std::vector<model::GPT2> models;
    std::vector<std::unique_ptr<pipeline::GptStage>> stages;
    std::vector<pipeline::Stage*> ptrs;
    for (int k = 0; k < c.per_rank; ++k) {
      const auto r = split[static_cast<size_t>(rank + k * n)];
      models.emplace_back(config, r);
      models.back()->reset_parameters(kSeed);
      models.back()->to(device);
      stages.push_back(std::make_unique<pipeline::GptStage>(
          models.back(), c.m, torch::kFloat32, model::LossPositions::kTargets, c.zero_bubble));
      if (c.lookup_per_step) stages.back()->sum_lookup_grads_per_step();
      stages.back()->set_batch(b);
      ptrs.push_back(stages.back().get());
    }
    const auto schedule =
        c.zero_bubble
            ? pipeline::make_zero_bubble_schedule(
                  c.kind, c.m, n, c.per_rank,
                  pipeline::zero_bubble_costs(split, static_cast<int>(config.n_layer),
                                              static_cast<int>(config.n_embd), kSeq,
                                              static_cast<int>(config.padded_vocab_size()), 1))
            : pipeline::make_schedule(c.kind, c.m, n, c.per_rank);
    pipeline::Executor executor(ptrs, transport, schedule[static_cast<size_t>(rank)], rank, n,
                                device);
    executor.run_step(0, 0.0);
    parallel::sync_tied_gradient(models, *comms[0]);
    double sum = 0;
    for (auto& s : stages) sum += s->take_loss();
    auto loss = torch::tensor({sum}, torch::kFloat64).to(device);
    comms[0]->broadcast(loss, n - 1);
    EXPECT_NEAR(loss.item<double>(), want_loss, 1e-5 * want_loss);
    for (const auto& model : models) {
      for (const auto& p : model->named_parameters()) {
        ASSERT_TRUE(p.value().grad().defined()) << p.key();
        const auto got = p.value().grad().cpu();
        const auto& want = ref.at(p.key());
        const double scale = std::max(want.abs().max().item<double>(), 1e-8);
        EXPECT_LT((got - want).abs().max().item<double>() / scale, 1e-4) << p.key();
      }
    }
    comms[0]->barrier();
  }
}

}  // namespace
}  // namespace gpt2p
