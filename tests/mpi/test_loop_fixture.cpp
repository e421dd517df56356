// The training loops' behaviour, pinned: short CPU runs of dp_train's and pp_train's loops at 2, 3
// and 4 ranks must give the same per-step losses and the same final parameters, bit for bit, as
// the runs recorded in tests/data/loop_fixture.json. A change to how the loops are organised must
// not change what they compute; a change that means to (a new default, another order of
// operations) re-records the fixture and says so in its commit:
//
//   GPT2P_RECORD_LOOP_FIXTURE=1 ctest --test-dir build -R test_loop_fixture -j1
//
// Everything is float32 on the CPU with one thread per rank, and ATen's portable CPU kernels
// (ATEN_CPU_CAPABILITY=default, MKL_CBWR=COMPATIBLE: tests/CMakeLists.txt), so the runs do not
// depend on the vector units of the machine.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "gpt2p/core/atomic_file.h"
#include "gpt2p/model/checkpoint.h"
#include "gpt2p/parallel/trainers/dp_trainer.h"
#include "gpt2p/parallel/trainers/pp_trainer.h"
#include "support/h5_read.h"
#include "support/trainer_fixture.h"

namespace gpt2p::parallel {
namespace {

namespace fs = std::filesystem;
using gpt2p::testing::read_column;

std::string fixture_path() {
  const char* data = std::getenv("GPT2P_TEST_DATA");
  return (fs::path(data != nullptr ? data : "tests/data") / "loop_fixture.json").string();
}

bool recording() {
  const char* env = std::getenv("GPT2P_RECORD_LOOP_FIXTURE");
  return env != nullptr && std::string(env) == "1";
}

// FNV-1a over every parameter's bytes, in name order: equal exactly when the weights are.
std::string parameter_hash(const std::string& checkpoint) {
  auto model = model::load_model(checkpoint);
  std::map<std::string, torch::Tensor> params;
  for (const auto& item : model->named_parameters()) params[item.key()] = item.value();
  uint64_t h = 1469598103934665603ULL;
  auto mix = [&](const unsigned char* p, size_t n) {
    for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ULL;
  };
  for (const auto& [name, value] : params) {
    mix(reinterpret_cast<const unsigned char*>(name.data()), name.size());
    const auto t = value.contiguous().to(torch::kFloat32);
    mix(static_cast<const unsigned char*>(t.data_ptr()), static_cast<size_t>(t.numel()) * 4);
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

class LoopFixture : public gpt2p::testing::TrainerTest {
 protected:
  // What a finished run left: rank 0's per-step losses and the hash of every checkpoint part.
  nlohmann::json observed(const std::string& out) const {
    nlohmann::json j;
    j["losses"] = read_column(rank_file(out), "/steps/loss");
    const std::string root = dir + "/" + out + "/checkpoint";
    nlohmann::json parts = nlohmann::json::object();
    std::vector<std::pair<std::string, std::string>> dirs;  // (part, checkpoint directory)
    if (model::is_checkpoint_dir(root)) {
      dirs.emplace_back("model", root);
    } else {
      for (int s = 0; fs::exists(root + "/stage" + std::to_string(s)); ++s) {
        dirs.emplace_back("stage" + std::to_string(s), root + "/stage" + std::to_string(s));
      }
    }
    // (The optimizer's moments are pinned through the losses and weights of the steps after the
    // first: optimizer.pt's bytes themselves differ from save to save.)
    for (const auto& [part, path] : dirs) parts[part] = parameter_hash(path);
    j["parameters"] = parts;
    if (!dirs.empty()) {
      const auto state = model::read_train_state(dirs.front().second);
      j["resume_at"] = {state.step, state.epoch, state.batch_in_epoch};
    }
    return j;
  }

  // Compares (or, recording, stores) run `out` under "<name>/np<ranks>".
  void check(const std::string& name, const std::string& out) {
    comm->barrier();
    if (comm->rank() != 0) return;
    const auto got = observed(out);
    const std::string key = "np" + std::to_string(comm->size());
    nlohmann::json fixture = nlohmann::json::object();
    if (fs::exists(fixture_path())) fixture = nlohmann::json::parse(std::ifstream(fixture_path()));
    if (recording()) {
      fixture[name][key] = got;
      write_text_atomically(fixture_path(), fixture.dump(1) + "\n");
      return;
    }
    ASSERT_TRUE(fixture.contains(name) && fixture[name].contains(key))
        << "no recorded run " << name << "/" << key << " in " << fixture_path()
        << " (record it with GPT2P_RECORD_LOOP_FIXTURE=1)";
    const auto& want = fixture[name][key];
    const auto losses = got["losses"].get<std::vector<double>>();
    const auto expected = want["losses"].get<std::vector<double>>();
    ASSERT_EQ(losses.size(), expected.size()) << name;
    for (size_t i = 0; i < losses.size(); ++i) {
      EXPECT_EQ(losses[i], expected[i]) << name << " step " << i << " (bitwise)";
    }
    EXPECT_EQ(got["parameters"], want["parameters"]) << name << ": final parameters differ";
    EXPECT_EQ(got["resume_at"], want["resume_at"]) << name << ": the checkpoint resumes elsewhere";
  }

  // Pipelines get one block per stage (the balanced partition needs as many).
  parallel::TrainConfig base(const std::string& out, int64_t steps, int stages_per_rank = 0) const {
    auto c = config(out, steps);
    if (stages_per_rank > 0) c.model.n_layer = stages_per_rank * comm->size();
    c.model.dropout = 0.1;    // the RNG streams are part of what is pinned
    c.output.save_every = 0;  // one checkpoint, at the end
    c.output.translate_samples = 0;
    return c;
  }
};

TEST_F(LoopFixture, DataParallelBucketed) {
  auto c = base("dp_bucketed", 4);
  c.data_parallel.grad_sync = gpt2p::parallel::GradSyncMode::kBucketed;
  c.data_parallel.bucket_mb = 0.05;
  ASSERT_EQ(train_data_parallel(c, parallel::Program::kDataParallel, topo), 0);
  check("dp_bucketed", "dp_bucketed");
}

TEST_F(LoopFixture, DataParallelPerParamDenseEmbedding) {
  auto c = base("dp_per_param", 3);
  c.data_parallel.grad_sync = gpt2p::parallel::GradSyncMode::kPerParam;
  c.data_parallel.embedding_sync = gpt2p::parallel::EmbeddingSync::kDense;
  ASSERT_EQ(train_data_parallel(c, parallel::Program::kDataParallel, topo), 0);
  check("dp_per_param", "dp_per_param");
}

// ZeRO-1's sharded AdamW, two accumulated micro-steps a step, and clipping that bites (the tiny
// model's norm is far above 0.05), so the sharded norm and the scaled update are pinned as well.
TEST_F(LoopFixture, DataParallelZeroAccumulatedClipped) {
  auto c = base("dp_zero", 3);
  c.optim.epochs = 2;  // 2 steps an epoch: the third starts the second epoch
  c.data_parallel.zero = 1;
  c.optim.grad_accum = 2;
  c.optim.grad_clip = 0.05;
  c.optim.batch_size = 24;
  ASSERT_EQ(train_data_parallel(c, parallel::Program::kDataParallel, topo), 0);
  check("dp_zero", "dp_zero");
}

TEST_F(LoopFixture, Pipeline1F1B) {
  auto c = base("pp_1f1b", 3, 1);
  c.pipeline.mode = gpt2p::parallel::PipelineMode::kPipeline;
  c.pipeline.schedule = gpt2p::pipeline::ScheduleKind::kOneFOneB;
  c.pipeline.microbatches = 2;
  ASSERT_EQ(train_pipeline(c, topo), 0);
  check("pp_1f1b", "pp_1f1b");
}

TEST_F(LoopFixture, PipelineInterleaved) {
  auto c = base("pp_interleaved", 3, 2);
  c.pipeline.mode = gpt2p::parallel::PipelineMode::kPipeline;
  c.pipeline.schedule = gpt2p::pipeline::ScheduleKind::kInterleaved;
  c.pipeline.stages_per_rank = 2;
  c.pipeline.microbatches = comm->size();
  ASSERT_EQ(train_pipeline(c, topo), 0);
  check("pp_interleaved", "pp_interleaved");
}

TEST_F(LoopFixture, PipelineGPipeZeroBubble) {
  auto c = base("pp_gpipe_zb", 3, 1);
  c.pipeline.mode = gpt2p::parallel::PipelineMode::kPipeline;
  c.pipeline.schedule = gpt2p::pipeline::ScheduleKind::kGPipe;
  c.pipeline.zero_bubble = true;
  c.pipeline.microbatches = 2;
  ASSERT_EQ(train_pipeline(c, topo), 0);
  check("pp_gpipe_zb", "pp_gpipe_zb");
}

TEST_F(LoopFixture, ModelParallel) {
  auto c = base("pp_mp", 3, 1);
  c.pipeline.mode = gpt2p::parallel::PipelineMode::kModelParallel;
  ASSERT_EQ(train_pipeline(c, topo), 0);
  check("pp_mp", "pp_mp");
}

// Two replicas of a 2-stage 1F1B pipeline (4 ranks): the replicas' gradient sums, with and
// without ZeRO-1 over each stage's replicas.
parallel::TrainConfig hybrid(parallel::TrainConfig c) {
  c.model.n_layer = 4;
  c.pipeline.dp = 2;
  c.pipeline.mode = gpt2p::parallel::PipelineMode::kPipeline;
  c.pipeline.schedule = gpt2p::pipeline::ScheduleKind::kOneFOneB;
  c.pipeline.microbatches = 2;
  c.optim.batch_size = 24;
  c.optim.epochs = 2;  // 2 steps an epoch: the third starts the second epoch
  return c;
}

TEST_F(LoopFixture, HybridReplicatedPipelines) {
  if (comm->size() != 4) GTEST_SKIP() << "two 2-stage replicas need 4 ranks";
  auto c = hybrid(base("hybrid", 3));
  ASSERT_EQ(train_pipeline(c, topo), 0);
  check("hybrid", "hybrid");
}

TEST_F(LoopFixture, HybridZero) {
  if (comm->size() != 4) GTEST_SKIP() << "two 2-stage replicas need 4 ranks";
  auto c = hybrid(base("hybrid_zero", 3));
  c.data_parallel.zero = 1;
  ASSERT_EQ(train_pipeline(c, topo), 0);
  check("hybrid_zero", "hybrid_zero");
}

}  // namespace
}  // namespace gpt2p::parallel
