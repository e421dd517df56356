// Decoding (model/generate.h) on made-up logits, and a pipeline checkpoint's stages joined into
// the model they were cut from (model/model_dir.h).
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "gpt2p/core/error.h"
#include "gpt2p/model/checkpoint.h"
#include "gpt2p/model/generate.h"
#include "gpt2p/model/model_dir.h"
#include "support/small_model.h"
#include "support/temp_dir.h"

namespace gpt2p::model {
namespace {

constexpr int64_t kVocab = 10;
const torch::Device kCpu(torch::kCPU);

// The next token is the last one + 1 (mod kVocab), by a margin of `margin` over every other; the
// logits have 2 padding columns that would win if they counted.
NextLogitsFn counting_model(int& calls, double margin = 5.0) {
  return [&calls, margin](const torch::Tensor& ids) {
    ++calls;
    auto logits = torch::zeros({1, ids.size(1), kVocab + 2});
    logits.narrow(2, kVocab, 2).fill_(100.0);
    const int64_t next = (ids[0][-1].item<int64_t>() + 1) % kVocab;
    logits[0][ids.size(1) - 1][next] = margin;
    return logits;
  };
}

Decoding greedy(int64_t max_length, int64_t max_new = 0, int64_t stop = -1) {
  Decoding d;
  d.vocab_size = kVocab;
  d.max_length = max_length;
  d.max_new = max_new;
  d.stop_token = stop;
  return d;
}

TEST(Generate, GreedyStopsAtTheStopTokenTheNewTokenLimitOrTheLength) {
  int calls = 0;
  auto out = generate(counting_model(calls), {3}, greedy(100, 0, /*stop=*/7), kCpu);
  EXPECT_EQ(out.tokens, (std::vector<int64_t>{4, 5, 6}));
  EXPECT_EQ(out.reason, StopReason::kStopToken);
  EXPECT_EQ(calls, 4);  // the pass that gave the stop token counts

  calls = 0;
  out = generate(counting_model(calls), {3}, greedy(100, /*max_new=*/2), kCpu);
  EXPECT_EQ(out.tokens, (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(out.reason, StopReason::kMaxNew);
  EXPECT_EQ(calls, 2);

  out = generate(counting_model(calls), {8, 9}, greedy(/*max_length=*/5), kCpu);
  EXPECT_EQ(out.tokens, (std::vector<int64_t>{0, 1, 2}));  // wraps; never a padding column
  EXPECT_EQ(out.reason, StopReason::kMaxLength);
}

TEST(Generate, SamplingIsReproducibleAndTopKKeepsToTheLikeliest) {
  int calls = 0;
  Decoding d = greedy(60);
  d.temperature = 1.0;
  d.seed = 11;
  // A margin of 0: every token equally likely, so seeds show.
  const auto a = generate(counting_model(calls, 0.0), {0}, d, kCpu);
  const auto b = generate(counting_model(calls, 0.0), {0}, d, kCpu);
  EXPECT_EQ(a.tokens, b.tokens);
  d.seed = 12;
  const auto c = generate(counting_model(calls, 0.0), {0}, d, kCpu);
  EXPECT_NE(a.tokens, c.tokens);
  std::set<int64_t> seen(a.tokens.begin(), a.tokens.end());
  EXPECT_GT(seen.size(), 5U);
  for (const int64_t t : a.tokens) EXPECT_LT(t, kVocab);

  // top-k 1 is greedy, at any temperature.
  d.top_k = 1;
  d.temperature = 50.0;
  const auto k1 = generate(counting_model(calls), {3}, d, kCpu);
  std::vector<int64_t> expected;
  for (int64_t i = 0; i < 59; ++i) expected.push_back((4 + i) % kVocab);
  EXPECT_EQ(k1.tokens, expected);
}

TEST(Generate, SettingsOutOfRangeAreErrors) {
  int calls = 0;
  const auto model = counting_model(calls);
  EXPECT_THROW(generate(model, {}, greedy(10), kCpu), Error);
  EXPECT_THROW(generate(model, {1, 2, 3}, greedy(3), kCpu), Error);  // no room
  Decoding d = greedy(10);
  d.temperature = -1;
  EXPECT_THROW(generate(model, {1}, d, kCpu), Error);
  d.temperature = std::nan("");
  EXPECT_THROW(generate(model, {1}, d, kCpu), Error);
  d = greedy(10);
  d.top_k = -2;
  EXPECT_THROW(generate(model, {1}, d, kCpu), Error);
  EXPECT_EQ(calls, 0);
}

// Stage checkpoints of a model, as pp_train lays them out under `root`.
void save_stages(const std::string& root, const GPT2Config& config,
                 const std::vector<LayerRange>& ranges, uint64_t seed) {
  for (size_t s = 0; s < ranges.size(); ++s) {
    GPT2 stage(config, ranges[s]);
    stage->reset_parameters(seed);
    save_checkpoint(root + "/stage" + std::to_string(s), *stage, nullptr, TrainState{});
  }
  write_checkpoint_manifest(root, {{"stages", static_cast<int64_t>(ranges.size())}});
}

TEST(ModelDir, APipelineCheckpointsStagesJoinIntoTheWholeModel) {
  testing::TempDir dir("model_dir");
  const auto config = testing::small_model(3, 64);
  const int layers = static_cast<int>(config.num_stage_layers());  // 5: embedding, 3 blocks, head
  save_stages(dir / "ck", config, {{0, 2}, {2, 4}, {4, layers}}, 5);
  GPT2 full(config);
  full->reset_parameters(5);  // each layer from its own generator: the stages' weights
  full->eval();
  const auto joined = load_model_dir(dir / "ck");
  EXPECT_EQ(joined.kind, "pipeline checkpoint");
  GPT2 model = joined.model;
  ASSERT_TRUE(model->is_full());
  model->eval();
  torch::NoGradGuard no_grad;
  const auto ids = torch::randint(0, 64, {2, 7}, torch::kLong);
  EXPECT_TRUE(torch::equal(model->forward(ids), full->forward(ids)));
}

TEST(ModelDir, BrokenPipelineCheckpointsSayWhatIsWrong) {
  testing::TempDir dir("model_dir_bad");
  const auto config = testing::small_model(2, 64);
  const int layers = static_cast<int>(config.num_stage_layers());
  const auto message = [](const std::string& path) {
    try {
      load_model_dir(path);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  // A gap between the stages.
  save_stages(dir / "gap", config, {{0, 1}, {2, layers}}, 1);
  EXPECT_NE(message(dir / "gap").find("stages before it end at layer 1"), std::string::npos)
      << message(dir / "gap");
  // The manifest lists a stage that is not there.
  save_stages(dir / "short", config, {{0, 2}}, 1);
  write_checkpoint_manifest(dir / "short", {{"stages", 2}});
  EXPECT_NE(message(dir / "short").find("stage1 is not a checkpoint"), std::string::npos)
      << message(dir / "short");
  // A stage directory alone is not the whole model.
  EXPECT_NE(message(dir / "gap/stage0").find("pass the pipeline checkpoint's root"),
            std::string::npos);
  // Neither kind of checkpoint.
  EXPECT_NE(message(dir.path().string()).find("is neither a gpt2p checkpoint"), std::string::npos);
}

}  // namespace
}  // namespace gpt2p::model
