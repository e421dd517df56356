#include "gpt2p/parallel/trainers/stage_split.h"

#include <torch/torch.h>

#include <string>

#include "gpt2p/core/error.h"
#include "gpt2p/model/checkpoint.h"
#include "gpt2p/parallel/train/checkpoint_commit.h"
#include "gpt2p/pipeline/perf/layer_profile.h"

namespace gpt2p::parallel {

pipeline::Partition stage_partition(pipeline::PartitionKind partition,
                                    const model::GPT2Config& config, int n_stages, int64_t seq_len,
                                    const std::vector<double>& measured_costs, int stages_per_rank,
                                    double loss_fraction) {
  GPT2P_CHECK(stages_per_rank >= 1 && n_stages % stages_per_rank == 0,
              n_stages << " stages do not split into " << stages_per_rank << " per rank",
              "pass a stage count that is ranks x --stages-per-rank");
  const auto balance = [&](const std::vector<double>& costs) {
    return pipeline::partition_interleaved(costs, n_stages / stages_per_rank, stages_per_rank);
  };
  const int blocks = static_cast<int>(config.n_layer);
  if (partition == pipeline::PartitionKind::kUniform) {
    return pipeline::partition_uniform(blocks, n_stages);
  }
  if (partition == pipeline::PartitionKind::kMeasured) {
    GPT2P_CHECK(measured_costs.size() == static_cast<size_t>(blocks) + 2,
                "--partition measured: " << measured_costs.size() << " layer costs for a model of "
                                         << blocks << " blocks (expected " << blocks + 2 << ")",
                "measure them with measured_layer_costs() for this model");
    return balance(measured_costs);
  }
  const auto costs = pipeline::layer_costs_flops(
      blocks, static_cast<int>(config.n_embd), static_cast<int>(config.n_head),
      static_cast<int>(seq_len), static_cast<int>(config.padded_vocab_size()), loss_fraction);
  return balance(costs);
}

std::vector<double> measured_layer_costs(comm::Communicator& comm, const model::GPT2Config& config,
                                         int64_t micro_rows, int64_t seq_len,
                                         torch::ScalarType autocast, pipeline::LayerTiming timing) {
  auto t = torch::zeros({3}, torch::TensorOptions().dtype(torch::kFloat64));
  if (comm.rank() == 0) {
    timing.measure_memory = false;  // the split needs the times only
    const auto times =
        pipeline::measure_layer_times(config, micro_rows, seq_len, autocast, comm.device(), timing);
    t = torch::tensor({times.embedding, times.block, times.head}, t.options());
  }
  t = t.to(comm.device());
  if (comm.size() > 1) comm.broadcast(t, 0);
  t = t.cpu();
  pipeline::LayerTimes times;
  times.embedding = t[0].item<double>();
  times.block = t[1].item<double>();
  times.head = t[2].item<double>();
  return pipeline::layer_costs_from_times(times, static_cast<int>(config.n_layer));
}

// (A measured split can come out differently on another day: the checkpoint's is kept.)
pipeline::Partition checkpoint_partition(const std::string& resume, int n_stages, int dp) {
  check_stage_checkpoint(resume, n_stages, dp);
  pipeline::Partition split;
  for (int s = 0; s < n_stages; ++s) {
    const std::string dir = resume + "/stage" + std::to_string(s);
    GPT2P_CHECK(model::is_checkpoint_dir(dir),
                "--resume " << resume << ": no checkpoint for stage " << s << " of " << n_stages
                            << " (" << dir << "/meta.json missing)",
                "resume with the ranks and --stages-per-rank of the run that wrote the checkpoint");
    const auto r = model::checkpoint_range(dir);
    split.push_back({static_cast<int>(r.begin), static_cast<int>(r.end)});
  }
  GPT2P_CHECK(!model::is_checkpoint_dir(resume + "/stage" + std::to_string(n_stages)),
              "--resume " << resume << " holds more than " << n_stages << " stages",
              "resume with the ranks and --stages-per-rank of the run that wrote the checkpoint");
  return split;
}

}  // namespace gpt2p::parallel
