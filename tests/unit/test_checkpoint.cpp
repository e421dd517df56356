// safetensors, Hugging Face import/export, our checkpoints, and the gpt2_eval program.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <tuple>
#include <vector>

#include "gpt2p/compat/rng.h"
#include "gpt2p/core/atomic_file.h"
#include "gpt2p/core/error.h"
#include "gpt2p/data/batch.h"
#include "gpt2p/data/dataset_file.h"
#include "gpt2p/model/checkpoint.h"
#include "gpt2p/model/hf_checkpoint.h"
#include "gpt2p/model/safetensors.h"
#include "gpt2p/parallel/train/checkpoint_commit.h"
#include "support/errors.h"
#include "support/temp_dir.h"
#include "support/tmpfs.h"

namespace gpt2p::model {
namespace {

using gpt2p::testing::error_of;
using gpt2p::testing::error_with_hint;

namespace fs = std::filesystem;

using gpt2p::testing::TempDir;
using gpt2p::testing::Tmpfs;

GPT2Config tiny_config(int64_t vocab = 100) {
  GPT2Config c = preset("tiny");
  c.vocab_size = vocab;
  c.n_ctx = 16;
  c.dropout = 0.0;
  return c;
}

torch::Tensor ids_for(const GPT2Config& c) {
  torch::manual_seed(11);
  return torch::randint(0, c.vocab_size, {2, 9}, torch::kLong);
}

TEST(SafeTensors, RoundTripEveryDtypeAndMetadata) {
  TempDir dir;
  torch::manual_seed(0);
  const std::map<std::string, torch::Tensor> in = {
      {"f32", torch::randn({3, 4})},
      {"f16", torch::randn({5}).to(torch::kFloat16)},
      {"bf16", torch::randn({2, 2, 2}).to(torch::kBFloat16)},
      {"f64", torch::randn({1, 7}, torch::kFloat64)},
      {"i64", torch::arange(-3, 6, torch::kLong)},
      {"empty", torch::zeros({0, 4})},
      {"noncontig", torch::randn({4, 3}).t()}};
  write_safetensors(dir / "a.safetensors", in, {{"format", "pt"}});
  const auto out = read_safetensors(dir / "a.safetensors");
  ASSERT_EQ(out.tensors.size(), in.size());
  for (const auto& [name, t] : in) {
    const auto& r = out.tensors.at(name);
    EXPECT_EQ(r.scalar_type(), t.scalar_type()) << name;
    EXPECT_TRUE(torch::equal(r, t)) << name;
  }
  EXPECT_EQ(out.metadata.at("format"), "pt");
  // The header length is little-endian, and the data section starts 8-byte aligned.
  std::ifstream f(dir / "a.safetensors", std::ios::binary);
  unsigned char len[8];
  f.read(reinterpret_cast<char*>(len), 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n * 256 + len[i];
  EXPECT_EQ(n % 8, 0U);
  EXPECT_LT(n, fs::file_size(dir / "a.safetensors"));
}

TEST(SafeTensors, ErrorsNameTheFileAndTensor) {
  TempDir dir;
  write_safetensors(dir / "a.safetensors", {{"w", torch::ones({4, 4})}});
  fs::resize_file(dir / "a.safetensors", fs::file_size(dir / "a.safetensors") - 4);
  const auto msg = error_of([&] { read_safetensors(dir / "a.safetensors"); });
  EXPECT_NE(msg.find("tensor 'w'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
  EXPECT_NE(error_of([&] { read_safetensors(dir / "missing.safetensors"); }).find("cannot open"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              write_safetensors(dir / "b.safetensors", {{"x", torch::ones({2}, torch::kInt32)}});
            }).find("cannot write tensor 'x'"),
            std::string::npos);
}

TEST(HfCheckpoint, ExportThenImportGivesTheSameLogits) {
  TempDir dir;
  const auto c = tiny_config();
  GPT2 model(c);
  model->reset_parameters(5);
  model->eval();
  export_hf(dir / "hf", *model);
  const auto config = nlohmann::json::parse(std::ifstream(dir / "hf/config.json"));
  EXPECT_EQ(config["model_type"], "gpt2");
  EXPECT_EQ(config["n_positions"], 16);
  EXPECT_EQ(config["activation_function"], "gelu_new");
  const auto file = read_safetensors(dir / "hf/model.safetensors");
  EXPECT_EQ(file.tensors.at("transformer.wte.weight").sizes(), (std::vector<int64_t>{100, 64}));
  EXPECT_EQ(file.tensors.at("transformer.h.1.mlp.c_fc.weight").sizes(),
            (std::vector<int64_t>{64, 256}));  // Conv1D: [in, out]
  EXPECT_EQ(file.metadata.at("format"), "pt");
  EXPECT_TRUE(is_hf_dir(dir / "hf"));

  GPT2 back = load_hf(dir / "hf");
  EXPECT_EQ(back->config(), c);
  back->eval();
  const auto ids = ids_for(c);
  EXPECT_TRUE(torch::allclose(back->forward(ids), model->forward(ids), 0, 1e-6));
}

TEST(HfCheckpoint, Conv1DTransposeAndPrefixesOnAHandMadeFile) {
  // A 1-layer HF-layout file with known values: Conv1D weight [in, out] with w[i][o] = i*100 + o.
  TempDir dir;
  GPT2Config c = tiny_config(64);
  c.n_layer = 1;
  c.n_embd = 4;
  c.n_head = 2;
  GPT2 model(c);
  std::map<std::string, torch::Tensor> hf;
  for (const auto& item : model->named_parameters()) {
    auto t = torch::zeros_like(item.value());
    if (item.key() == "wte.weight") t = t.narrow(0, 0, c.vocab_size);
    if (item.key().find("c_attn.weight") != std::string::npos ||
        item.key().find("c_fc.weight") != std::string::npos ||
        item.key().find("c_proj.weight") != std::string::npos) {
      t = t.t().contiguous();  // HF layout
    }
    // Hub style for some names (no prefix), save_pretrained style for others.
    const bool prefixed = item.key().rfind("h.", 0) == 0;
    hf[(prefixed ? "transformer." : "") + item.key()] = t;
  }
  const auto in_out = torch::arange(4).unsqueeze(1) * 100 + torch::arange(12).unsqueeze(0);
  hf["transformer.h.0.attn.c_attn.weight"] = in_out.to(torch::kFloat32);
  hf["h.0.attn.bias"] = torch::ones({1, 1, 16, 16});  // HF's mask buffer: ignored
  write_safetensors(dir / "hf/model.safetensors", hf);
  export_hf(dir / "cfg", *model);
  fs::copy_file(dir / "cfg/config.json", dir / "hf/config.json");
  import_hf(dir / "hf", *model);
  const auto w = model->named_parameters()["h.0.attn.c_attn.weight"];  // ours: [out=12, in=4]
  ASSERT_EQ(w.sizes(), (std::vector<int64_t>{12, 4}));
  EXPECT_EQ(w[7][2].item<float>(), 207.0f);
  EXPECT_EQ(w[11][3].item<float>(), 311.0f);

  // A wrong shape names the tensor and both shapes.
  hf["transformer.h.0.mlp.c_fc.weight"] = torch::zeros({4, 8});
  write_safetensors(dir / "hf/model.safetensors", hf);
  const auto msg = error_of([&] { import_hf(dir / "hf", *model); });
  EXPECT_NE(msg.find("'h.0.mlp.c_fc.weight' has shape [8, 4]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[16, 4]"), std::string::npos) << msg;
}

TEST(HfCheckpoint, ExtraVocabRowsGetTheMeanEmbeddingAndPaddingIsZero) {
  TempDir dir;
  GPT2 hf_model(tiny_config(100));
  hf_model->reset_parameters(2);
  export_hf(dir / "hf", *hf_model);
  GPT2 ours = load_hf(dir / "hf", /*extra_vocab=*/3);
  const auto w = ours->wte->weight;
  ASSERT_EQ(ours->config().vocab_size, 103);
  const auto mean = hf_model->wte->weight.narrow(0, 0, 100).mean(0);
  for (int64_t row = 100; row < 103; ++row) EXPECT_TRUE(torch::allclose(w[row], mean, 0, 1e-7));
  EXPECT_TRUE(torch::equal(w.narrow(0, 0, 100), hf_model->wte->weight.narrow(0, 0, 100)));
  EXPECT_EQ(w.narrow(0, 103, 128 - 103).abs().sum().item<double>(), 0.0);
}

TEST(Checkpoint, SavingAgainReplacesItAndLeavesNothingBehind) {
  // Every epoch's save replaces the previous checkpoint. In a program linking PyTorch's wheel this
  // crashed once (std::filesystem::remove_all from the wheel, core/atomic_file.h): this binary
  // links libtorch, so the GPU machine's ctest -L unit runs the same path.
  TempDir dir;
  const auto c = tiny_config();
  GPT2 model(c);
  model->reset_parameters(3);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-3));
  for (int64_t step = 1; step <= 3; ++step) {
    TrainState state;
    state.step = step;
    save_checkpoint(dir / "ckpt", *model, &opt, state);
  }
  GPT2 other(c);
  EXPECT_EQ(load_checkpoint(dir / "ckpt", *other, nullptr).step, 3);
  EXPECT_EQ(dir.entries(), 1) << "no ckpt.old.* or ckpt.tmp.* may be left";
}

TEST(Checkpoint, RoundTripWithOptimizerStateAndTrainState) {
  TempDir dir;
  const auto c = tiny_config();
  GPT2 model(c);
  model->reset_parameters(3);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-3));
  const auto ids = ids_for(c);
  auto train_step = [&](GPT2& m, torch::optim::Optimizer& o) {
    o.zero_grad();
    m->lm_loss_all(m->forward(ids), ids).backward();
    o.step();
  };
  train_step(model, opt);
  TrainState state;
  state.step = 17;
  state.epoch = 2;
  state.batch_in_epoch = 5;
  state.seed = 1234567890123ULL;
  state.rng_state = compat::cpu_rng_state();
  state.config = {{"lr", 1e-3}, {"name", "unit"}};
  save_checkpoint(dir / "ck", *model, &opt, state);
  EXPECT_TRUE(is_checkpoint_dir(dir / "ck"));
  EXPECT_FALSE(is_hf_dir(dir / "ck"));

  GPT2 loaded(c);
  torch::optim::AdamW opt2(loaded->parameters(), torch::optim::AdamWOptions(1e-3));
  const TrainState got = load_checkpoint(dir / "ck", *loaded, &opt2);
  EXPECT_EQ(got.step, 17);
  EXPECT_EQ(got.epoch, 2);
  EXPECT_EQ(got.batch_in_epoch, 5);
  EXPECT_EQ(got.seed, 1234567890123ULL);
  EXPECT_EQ(got.rng_state, state.rng_state);
  EXPECT_EQ(got.config, state.config);
  for (const auto& item : model->named_parameters()) {
    EXPECT_TRUE(torch::equal(item.value(), loaded->named_parameters()[item.key()])) << item.key();
  }
  // Optimizer state restored: one more identical step on both gives identical weights.
  train_step(model, opt);
  train_step(loaded, opt2);
  for (const auto& item : model->named_parameters()) {
    EXPECT_TRUE(torch::equal(item.value(), loaded->named_parameters()[item.key()])) << item.key();
  }
  // RNG state restores torch's generator.
  compat::set_cpu_rng_state(got.rng_state);
  const auto a = torch::rand({4});
  compat::set_cpu_rng_state(got.rng_state);
  EXPECT_TRUE(torch::equal(a, torch::rand({4})));
  // load_model rebuilds from meta.json.
  EXPECT_EQ(load_model(dir / "ck")->config(), c);
}

TEST(Checkpoint, MismatchErrorsNameCheckpointParameterShapesAndFix) {
  TempDir dir;
  save_checkpoint(dir / "ck", *GPT2(tiny_config()), nullptr, TrainState{});
  GPT2Config wider = tiny_config();
  wider.n_embd = 128;
  GPT2 other(wider);
  const auto msg = error_of([&] { load_checkpoint(dir / "ck", *other, nullptr); });
  EXPECT_NE(msg.find("checkpoint " + dir / "ck"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'wte.weight' has shape [128, 64] in the file but [128, 128] in the model"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("build the model with the checkpoint's config (2 layers"), std::string::npos)
      << msg;
  // A stage takes its layers from a full checkpoint; a full model rejects unknown tensors.
  GPT2 stage(tiny_config(), LayerRange{2, 4});
  stage->reset_parameters(99);
  load_checkpoint(dir / "ck", *stage, nullptr);
  EXPECT_TRUE(torch::equal(stage->tied_parameter(), load_model(dir / "ck")->tied_parameter()));
  GPT2Config deeper = tiny_config();
  deeper.n_layer = 1;
  GPT2 shallow(deeper);
  EXPECT_NE(error_of([&] {
              load_checkpoint(dir / "ck", *shallow, nullptr);
            }).find("'h.1.attn.c_attn.bias' [192] that the model (layers [0, 3)) does not have"),
            std::string::npos);
  GPT2 same(tiny_config());
  torch::optim::SGD sgd2(same->parameters(), torch::optim::SGDOptions(0.1));
  EXPECT_NE(error_of([&] { load_checkpoint(dir / "ck", *same, &sgd2); }).find("no optimizer state"),
            std::string::npos);
  EXPECT_NE(
      error_of([&] { load_checkpoint(dir / "nothing", *same, nullptr); }).find("has no meta.json"),
      std::string::npos);
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void spit(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// A tiny model one AdamW step in (so the optimizer has state), saved at `step`.
struct Trained {
  GPT2 model{tiny_config()};
  torch::optim::AdamW opt{model->parameters(), torch::optim::AdamWOptions(1e-3)};
  Trained() {
    model->reset_parameters(3);
    const auto ids = ids_for(model->config());
    opt.zero_grad();
    model->lm_loss_all(model->forward(ids), ids).backward();
    opt.step();
  }
  void save(const std::string& dir, int64_t step) {
    TrainState s;
    s.step = step;
    save_checkpoint(dir, *model, &opt, s);
  }
};

TEST(Checkpoint, FullDiskKeepsThePreviousCheckpointAndSaysWhy) {
  Tmpfs tmpfs("size=8m");
  if (!tmpfs.mounted()) GTEST_SKIP() << "cannot mount a tmpfs: " << tmpfs.error();
  Trained t;
  const std::string ckpt = tmpfs / "checkpoint";
  t.save(ckpt, 1);
  const auto model_bytes = fs::file_size(ckpt + "/model.safetensors");
  ASSERT_GT(fs::file_size(ckpt + "/optimizer.pt"), model_bytes);
  // Room for the model file but not the optimizer's (the path that aborted in torch's stream
  // writer), then room for almost nothing.
  for (const uint64_t room : {model_bytes + 64 * 1024, uint64_t{4096}}) {
    {
      FileWriter filler(tmpfs / "filler");
      const uint64_t n = tmpfs.free_bytes() > room ? tmpfs.free_bytes() - room : 0;
      const std::string block(1 << 16, '\0');
      for (uint64_t done = 0; done < n; done += block.size()) {
        filler.write(block.data(), std::min<uint64_t>(block.size(), n - done));
      }
      filler.close();
    }
    const auto msg = error_with_hint([&] { t.save(ckpt, 2); });
    EXPECT_NE(msg.find("no space left on device writing " + ckpt + ".tmp."), std::string::npos)
        << msg;
    EXPECT_NE(msg.find("free disk space or point --out elsewhere; the previous checkpoint " + ckpt +
                       " is kept"),
              std::string::npos)
        << msg;
    EXPECT_EQ(tmpfs.entries(), 2) << "checkpoint and filler only: no checkpoint.tmp.* or .old.*";
    GPT2 back(tiny_config());
    torch::optim::AdamW opt(back->parameters(), torch::optim::AdamWOptions(1e-3));
    EXPECT_EQ(load_checkpoint(ckpt, *back, &opt).step, 1);
    ASSERT_TRUE(remove_tree(tmpfs / "filler"));
  }
  t.save(ckpt, 3);  // with room again, saving works
  EXPECT_EQ(read_train_state(ckpt).step, 3);
}

TEST(Checkpoint, ReadOnlyFileSystemSaysSoAndKeepsThePreviousCheckpoint) {
  Tmpfs tmpfs("size=8m");
  if (!tmpfs.mounted()) GTEST_SKIP() << "cannot mount a tmpfs: " << tmpfs.error();
  Trained t;
  const std::string ckpt = tmpfs / "checkpoint";
  t.save(ckpt, 1);
  ASSERT_TRUE(tmpfs.remount_read_only()) << std::strerror(errno);
  const auto msg = error_with_hint([&] { t.save(ckpt, 2); });
  EXPECT_NE(msg.find("read-only file system"), std::string::npos) << msg;
  EXPECT_NE(msg.find("is on a read-only file system: point --out at a writable directory; the "
                     "previous checkpoint " +
                     ckpt + " is kept"),
            std::string::npos)
      << msg;
  EXPECT_EQ(msg.find("disk space"), std::string::npos) << msg;
  EXPECT_EQ(read_train_state(ckpt).step, 1);
  EXPECT_EQ(tmpfs.entries(), 1);
}

TEST(Checkpoint, MetaJsonRecordsSizeAndCrcOfEveryFile) {
  TempDir dir;
  Trained t;
  t.save(dir / "ck", 1);
  const auto meta = nlohmann::json::parse(std::ifstream(dir / "ck/meta.json"));
  for (const std::string name : {"model.safetensors", "optimizer.pt"}) {
    ASSERT_TRUE(meta["files"].contains(name)) << meta.dump();
    EXPECT_EQ(meta["files"][name]["bytes"].get<uint64_t>(), fs::file_size(dir / "ck/" + name));
    EXPECT_EQ(meta["files"][name]["crc32"].get<std::string>().size(), 8U);
  }
  EXPECT_NO_THROW(verify_checkpoint(dir / "ck"));
  save_checkpoint(dir / "weights", *t.model, nullptr, TrainState{});
  const auto weights = nlohmann::json::parse(std::ifstream(dir / "weights/meta.json"));
  EXPECT_EQ(weights["files"].size(), 1U) << weights["files"].dump();
}

TEST(Checkpoint, FlippedBytesAreRejectedNamingTheFileAndBothChecksums) {
  TempDir dir;
  Trained t;
  const std::string ck = dir / "ck";
  t.save(ck, 1);
  for (const std::string name : {"model.safetensors", "optimizer.pt"}) {
    const std::string path = ck + "/" + name;
    const std::string good = slurp(path);
    std::string bad = good;
    bad[bad.size() - 100] ^= 0x10;  // tensor data: the file still parses
    spit(path, bad);
    GPT2 back(tiny_config());
    torch::optim::AdamW opt(back->parameters(), torch::optim::AdamWOptions(1e-3));
    const auto msg = error_with_hint([&] { load_checkpoint(ck, *back, &opt); });
    EXPECT_NE(msg.find(path + " does not match meta.json: expected " + std::to_string(good.size()) +
                       " bytes with crc32 "),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("the checkpoint is corrupt: resume from an earlier copy"), std::string::npos)
        << msg;
    EXPECT_NE(error_of([&] { verify_checkpoint(ck); }).find(path), std::string::npos);
    // A truncated file: the size differs.
    spit(path, good.substr(0, good.size() / 2));
    EXPECT_NE(error_of([&] {
                load_checkpoint(ck, *back, &opt);
              }).find("found " + std::to_string(good.size() / 2) + " bytes"),
              std::string::npos);
    spit(path, good);
  }
  GPT2 back(tiny_config());
  EXPECT_EQ(load_checkpoint(ck, *back, nullptr).step, 1);
}

TEST(Checkpoint, WithoutChecksumsOnlyWhenAllowedAndACorruptOptimizerIsOurError) {
  TempDir dir;
  Trained t;
  const std::string ck = dir / "ck";
  t.save(ck, 4);
  auto meta = nlohmann::json::parse(std::ifstream(ck + "/meta.json"));
  meta.erase("files");
  meta.erase("rank_rng_states");
  spit(ck + "/meta.json", meta.dump(2));
  GPT2 back(tiny_config());
  torch::optim::AdamW opt(back->parameters(), torch::optim::AdamWOptions(1e-3));
  // Refused by default: nothing would tell a flipped byte.
  auto refused = error_with_hint([&] { load_checkpoint(ck, *back, &opt); });
  EXPECT_NE(refused.find("meta.json lists no checksums (\"files\"), so model.safetensors cannot "
                         "be verified"),
            std::string::npos)
      << refused;
  EXPECT_NE(refused.find("--allow-unverified-checkpoint"), std::string::npos) << refused;
  EXPECT_NE(error_with_hint([&] { verify_checkpoint(ck); }).find("lists no checksums"),
            std::string::npos);
  const LoadOptions allow{true};
  const auto state = load_checkpoint(ck, *back, &opt, allow);
  EXPECT_EQ(state.step, 4);
  EXPECT_TRUE(state.rank_rng_states.empty());
  EXPECT_NO_THROW(verify_checkpoint(ck, allow));
  // Without checksums a truncated optimizer.pt is caught by torch's reader: our error, with
  // context.
  const std::string opt_path = ck + "/optimizer.pt";
  const std::string good = slurp(opt_path);
  spit(opt_path, good.substr(0, good.size() / 3));
  const auto msg = error_with_hint([&] { load_checkpoint(ck, *back, &opt, allow); });
  EXPECT_NE(msg.find("cannot read the optimizer state " + opt_path), std::string::npos) << msg;
  EXPECT_NE(msg.find("resume from an earlier copy"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("Exception raised from"), std::string::npos) << "no C++ backtrace: " << msg;
}

TEST(Checkpoint, NonFiniteParametersOrOptimizerStateAreNotSaved) {
  TempDir dir;
  Trained t;
  const std::string ck = dir / "ck";
  t.save(ck, 1);
  const std::string meta_before = slurp(ck + "/meta.json");
  const std::string model_before = slurp(ck + "/model.safetensors");
  auto w = t.model->named_parameters()["h.0.mlp.c_fc.weight"];
  const auto saved = w.detach().clone();
  {
    torch::NoGradGuard no_grad;
    w[0][0] = std::numeric_limits<float>::quiet_NaN();
  }
  auto msg = error_with_hint([&] { t.save(ck, 2); });
  EXPECT_NE(msg.find("not saving: parameters are not finite at step 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'h.0.mlp.c_fc.weight'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("the last good checkpoint in " + ck + " is kept"), std::string::npos) << msg;
  EXPECT_NE(msg.find("lower --lr or use --precision fp32"), std::string::npos) << msg;
  {
    torch::NoGradGuard no_grad;
    w.copy_(saved);
    w[1][1] = std::numeric_limits<float>::infinity();
  }
  EXPECT_NE(error_of([&] { t.save(ck, 2); }).find("not finite"), std::string::npos);
  {
    torch::NoGradGuard no_grad;
    w.copy_(saved);
  }
  // The optimizer's moments.
  ASSERT_FALSE(t.opt.state().empty());
  auto& first = *t.opt.state().begin()->second;
  auto& adam = static_cast<torch::optim::AdamWParamState&>(first);
  adam.exp_avg_sq().view(-1)[0] = std::numeric_limits<float>::quiet_NaN();
  msg = error_with_hint([&] { t.save(ck, 3); });
  EXPECT_NE(msg.find("optimizer state is not finite at step 3"), std::string::npos) << msg;
  EXPECT_EQ(slurp(ck + "/meta.json"), meta_before);
  EXPECT_EQ(slurp(ck + "/model.safetensors"), model_before);
  EXPECT_EQ(dir.entries(), 1);
  // Nothing there yet: nothing is written.
  EXPECT_NE(error_of([&] { t.save(dir / "fresh", 3); }).find("nothing was written to"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(dir / "fresh"));
}

TEST(Checkpoint, ADivergedRunIsNotSavedAndTheLastGoodCheckpointIsKept) {
  TempDir dir;
  Trained t;
  const std::string ck = dir / "ck";
  t.save(ck, 1);
  const std::string model_before = slurp(ck + "/model.safetensors");
  auto w = t.model->named_parameters()["h.0.attn.c_proj.weight"];
  {
    torch::NoGradGuard no_grad;
    w[0][1] = 1e30F;  // finite, but where --lr 1e30 takes the weights
  }
  const auto msg = error_with_hint([&] { t.save(ck, 2); });
  EXPECT_NE(msg.find("not saving: the run has diverged by step 2 ('h.0.attn.c_proj.weight' holds "
                     "a value of magnitude 1e+30"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("the last good checkpoint in " + ck + " is kept"), std::string::npos) << msg;
  EXPECT_EQ(slurp(ck + "/model.safetensors"), model_before);
  {
    torch::NoGradGuard no_grad;
    w[0][1] = static_cast<float>(kDivergedMagnitude);  // the bound itself still saves
  }
  EXPECT_NO_THROW(t.save(ck, 2));
}

TEST(Checkpoint, NonFiniteWeightsOnLoadNameTheFileAndTheParameter) {
  TempDir dir;
  Trained t;
  const std::string ck = dir / "ck";
  t.save(ck, 1);
  // A file with NaN, as a damaged or foreign writer leaves it (checksums then cannot help).
  auto file = read_safetensors(ck + "/model.safetensors");
  file.tensors.at("ln_f.weight")[3] = std::numeric_limits<float>::quiet_NaN();
  write_safetensors(ck + "/model.safetensors", file.tensors, file.metadata);
  auto meta = nlohmann::json::parse(std::ifstream(ck + "/meta.json"));
  meta.erase("files");
  spit(ck + "/meta.json", meta.dump(2));
  GPT2 back(tiny_config());
  const auto msg = error_with_hint([&] { load_checkpoint(ck, *back, nullptr, {true}); });
  EXPECT_NE(msg.find(ck + "/model.safetensors: parameter 'ln_f.weight' holds NaN or Inf"),
            std::string::npos)
      << msg;
  EXPECT_EQ(msg.find("lower --lr"), std::string::npos) << msg;
}

// Each edit of a saved checkpoint's meta.json (key set to value) must make `read` fail with a
// message holding "meta.json: " + the expected text.
using MetaEdits = std::vector<std::tuple<std::string, nlohmann::json, std::string>>;
template <typename F>
void expect_meta_edits_refused(const std::string& ck, const MetaEdits& edits, F read) {
  const std::string good = slurp(ck + "/meta.json");
  for (const auto& [key, value, expect] : edits) {
    auto meta = nlohmann::json::parse(good);
    meta[key] = value;
    spit(ck + "/meta.json", meta.dump(2));
    const auto msg = error_with_hint(read);
    EXPECT_NE(msg.find("meta.json: " + expect), std::string::npos) << msg;
  }
  spit(ck + "/meta.json", good);
}

TEST(Checkpoint, MetaJsonCountsMustBeCountsAndDepthIsBounded) {
  TempDir dir;
  Trained t;
  const std::string ck = dir / "ck";
  t.save(ck, 3);
  expect_meta_edits_refused(
      ck,
      MetaEdits{{"step", -5, "\"step\" is -5, not >= 0"},
                {"epoch", "x", "\"epoch\" is a string, not an integer"},
                {"batch_in_epoch", 1.5, "\"batch_in_epoch\" is a number, not an integer"},
                {"step", nlohmann::json(), "\"step\" is null, not an integer"},
                {"seed", "7", "\"seed\" is a string, not an integer"},
                {"rng_state", 12, "\"rng_state\" is an integer, not a string"},
                {"rank_rng_states", "ab", "\"rank_rng_states\" is a string, not an array"},
                {"rank_rng_states", nlohmann::json::array({"ab", 3}),
                 "\"rank_rng_states\"[1] is an integer, not a hex string"},
                {"config", 5, "\"config\" is an integer, not an object"}},
      [&] { read_train_state(ck); });
  spit(ck + "/meta.json", std::string(1000, '[') + std::string(1000, ']'));
  const auto msg = error_with_hint([&] { read_train_state(ck); });
  EXPECT_NE(msg.find("meta.json: JSON nested deeper than 64 levels"), std::string::npos) << msg;
  EXPECT_FALSE(is_checkpoint_dir(ck));
}

TEST(Checkpoint, LayerRangeAndModelConfigAreCheckedBeforeAModelIsBuilt) {
  TempDir dir;
  Trained t;
  const std::string ck = dir / "ck";
  t.save(ck, 3);
  const std::string good = slurp(ck + "/meta.json");
  expect_meta_edits_refused(
      ck,
      MetaEdits{
          {"layer_range", "0-4", "\"layer_range\" is a string, not an array"},
          {"layer_range", nlohmann::json::array({0}), "\"layer_range\" is [0], not [begin, end]"},
          {"layer_range", nlohmann::json::array({3, 1}),
           "\"layer_range\" is [3,1], not [begin, end] "
           "with 0 <= begin < end <= 4"},
          {"layer_range", nlohmann::json::array({0, 1000000000}),
           "\"layer_range\" is [0,1000000000]"},
          {"layer_range", nlohmann::json::array({"a", 2}), "\"layer_range\" is [\"a\",2], not"},
          {"model_config", 7, "\"model_config\" is an integer, not an object"},
          {"files",
           {{"model.safetensors", {{"bytes", "12"}, {"crc32", "0"}}}},
           "\"files\"[\"model.safetensors\"]: \"bytes\" is a string, not an integer"},
          {"files",
           {{"model.safetensors", 3}},
           "\"files\": \"model.safetensors\" is an integer, not an object"},
          // A config that would ask for terabytes is refused before anything is allocated.
          {"model_config",
           {{"n_embd", 1000000000}},
           "\"model_config\": GPT-2 config: n_embd "
           "= 1000000000 exceeds 65536"}},
      [&] { load_model(ck); });
  // Within the bounds, but more weights than model.safetensors holds (a 2-layer file).
  auto meta = nlohmann::json::parse(good);
  meta["model_config"]["n_embd"] = 4096;
  meta["model_config"]["n_head"] = 32;
  spit(ck + "/meta.json", meta.dump(2));
  const auto msg = error_with_hint([&] { load_model(ck); });
  EXPECT_NE(msg.find("meta.json describes 403357696 parameters"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model.safetensors holds only"), std::string::npos) << msg;
  EXPECT_NE(msg.find("use the config they were saved with"), std::string::npos) << msg;
}

TEST(Checkpoint, ManifestFieldsMustBeCounts) {
  TempDir dir;
  const std::string root = dir / "set";
  save_checkpoint(root + "/stage0", *GPT2(tiny_config(), LayerRange{0, 2}), nullptr, TrainState{});
  for (const auto& [manifest, expect] : std::vector<std::pair<nlohmann::json, std::string>>{
           {{{"stages", "1"}, {"step", 0}}, ": \"stages\" is a string, not an integer"},
           {{{"stages", 1}, {"dp", 0}, {"step", 0}}, ": \"dp\" is 0, outside [1, 1048576]"},
           {{{"stages", 1}, {"step", -1}}, ": \"step\" is -1, not >= 0"},
           {{{"step", 0}}, " has no \"stages\""}}) {
    write_checkpoint_manifest(root, manifest);
    const auto msg = error_with_hint([&] { parallel::check_stage_checkpoint(root, 1, 1); });
    EXPECT_NE(msg.find(root + "/manifest.json" + expect), std::string::npos) << msg;
  }
  write_checkpoint_manifest(root, {{"stages", 1}, {"dp", 1}, {"step", 0}});
  EXPECT_NO_THROW(parallel::check_stage_checkpoint(root, 1, 1));
}

TEST(Checkpoint, RankRngStatesRoundTripAsHex) {
  TempDir dir;
  TrainState state;
  state.step = 9;
  state.rank_rng_states = {std::string("\x00\x01\xff rank0", 9), "", "rank 2"};
  save_checkpoint(dir / "ck", *GPT2(tiny_config()), nullptr, state);
  const auto meta = nlohmann::json::parse(std::ifstream(dir / "ck/meta.json"));
  ASSERT_EQ(meta["rank_rng_states"].size(), 3U);
  EXPECT_EQ(meta["rank_rng_states"][0], "0001ff2072616e6b30");
  EXPECT_EQ(meta["rank_rng_states"][1], "");
  EXPECT_EQ(read_train_state(dir / "ck").rank_rng_states, state.rank_rng_states);
}

TEST(CheckpointManifest, WrittenLastItMarksAMultiPartCheckpointAsCommitted) {
  TempDir dir;
  const std::string root = dir / "set";
  fs::create_directories(root);
  save_checkpoint(root + "/stage0", *GPT2(tiny_config(), LayerRange{0, 2}), nullptr, TrainState{});
  const auto msg = error_with_hint([&] { read_checkpoint_manifest(root); });
  EXPECT_NE(msg.find(root + " is not a committed checkpoint (no manifest.json): it was interrupted "
                            "while being written"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("resume from the previous one"), std::string::npos) << msg;
  write_checkpoint_manifest(root, {{"stages", {"stage0"}}, {"step", 7}});
  const auto manifest = read_checkpoint_manifest(root);
  EXPECT_EQ(manifest["format"], "gpt2p-checkpoint-set");
  EXPECT_EQ(manifest["step"], 7);
  EXPECT_EQ(manifest["stages"], nlohmann::json({"stage0"}));
  EXPECT_NE(error_of([&] {
              write_checkpoint_manifest(root, nlohmann::json::array());
            }).find("must be a JSON object"),
            std::string::npos);
  // Staged elsewhere, committed with one rename.
  const std::string staged = dir / "set.tmp";
  fs::create_directories(staged);
  TrainState later;
  later.step = 8;
  save_checkpoint(staged + "/stage0", *GPT2(tiny_config(), LayerRange{0, 2}), nullptr, later);
  write_checkpoint_manifest(staged, {{"step", 8}});
  replace_dir(staged, root);
  EXPECT_EQ(read_checkpoint_manifest(root)["step"], 8);
  EXPECT_EQ(read_train_state(root + "/stage0").step, 8);
  EXPECT_EQ(dir.entries(), 1);
}

// The kind is told by the root file alone: meta.json, else manifest.json, else none.
TEST(CheckpointKind, TheRootFileSaysWhichTrainerWroteIt) {
  TempDir dir;
  const std::string root = dir / "set";
  EXPECT_EQ(checkpoint_kind(root), CheckpointKind::kNone);  // not there
  fs::create_directories(root);
  save_checkpoint(root + "/stage0", *GPT2(tiny_config(), LayerRange{0, 2}), nullptr, TrainState{});
  EXPECT_EQ(checkpoint_kind(root), CheckpointKind::kNone);  // not committed
  EXPECT_EQ(checkpoint_kind(root + "/stage0"), CheckpointKind::kReplicated);
  write_checkpoint_manifest(root, {{"stages", 1}});
  EXPECT_EQ(checkpoint_kind(root), CheckpointKind::kPipeline);
  fs::create_directories(dir / "odd/meta.json");  // a folder of that name is no root file
  EXPECT_EQ(checkpoint_kind(dir / "odd"), CheckpointKind::kNone);
}

// gpt2_eval sits in the build directory, one level above this test binary.
std::string eval_binary() {
  return (fs::read_symlink("/proc/self/exe").parent_path().parent_path() / "gpt2_eval").string();
}

TEST(Gpt2Eval, PooledLossOnAnExportedTinyModelMatchesTheLibrary) {
  ASSERT_TRUE(fs::exists(eval_binary())) << eval_binary() << " (build target gpt2_eval)";
  TempDir dir;
  const auto c = tiny_config();
  GPT2 model(c);
  model->reset_parameters(9);
  model->eval();
  export_hf(dir / "hf", *model);
  save_checkpoint(dir / "ck", *model, nullptr, TrainState{});
  const std::vector<std::vector<int64_t>> seqs = {{1, 5, 9, 33, 2}, {7, 7, 99, 0, 12, 50, 3, 8}};
  {
    std::ofstream out(dir / "ids.jsonl");
    for (const auto& s : seqs) out << nlohmann::json{{"ids", s}}.dump() << "\n";
  }
  double sum = 0;
  int64_t tokens = 0;
  for (const auto& s : seqs) {
    const auto ids = torch::tensor(s, torch::kLong).unsqueeze(0);
    sum += lm_loss_all_sum(model->forward(ids), ids, c.vocab_size).item<double>();
    tokens += static_cast<int64_t>(s.size()) - 1;
  }
  for (const std::string& ckpt : {dir / "hf", dir / "ck"}) {
    const std::string cmd = eval_binary() + " --checkpoint " + ckpt + " --ids-jsonl " +
                            (dir / "ids.jsonl") + " --dump-logits " + (dir / "logits.bin") + " > " +
                            (dir / "out.json");
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    const auto out = nlohmann::json::parse(std::ifstream(dir / "out.json"));
    EXPECT_EQ(out["tokens"], tokens);
    EXPECT_NEAR(out["loss"].get<double>(), sum / tokens, 1e-5);
    EXPECT_NEAR(out["perplexity"].get<double>(), std::exp(sum / tokens), 1e-3);
    ASSERT_EQ(out["sequences"].size(), 2U);
    EXPECT_EQ(out["sequences"][1]["tokens"], 7);
    const auto shape = nlohmann::json::parse(std::ifstream(dir / "logits.bin.json"))["shape"];
    EXPECT_EQ(shape, nlohmann::json({5, c.vocab_size}));
    EXPECT_EQ(fs::file_size(dir / "logits.bin"), 5U * c.vocab_size * 4);
    std::ifstream bin(dir / "logits.bin", std::ios::binary);
    std::vector<float> first(c.vocab_size);
    bin.read(reinterpret_cast<char*>(first.data()), c.vocab_size * 4);
    const auto expect = model->forward(torch::tensor(seqs[0], torch::kLong).unsqueeze(0))[0][0];
    EXPECT_NEAR(first[42], expect[42].item<float>(), 1e-5);
  }
  // Bad input: the error names the file and line.
  {
    std::ofstream out(dir / "bad.jsonl");
    out << "{\"ids\": [1, 2]}\n{\"tokens\": [1]}\n";
  }
  const std::string cmd = eval_binary() + " --checkpoint " + (dir / "hf") + " --ids-jsonl " +
                          (dir / "bad.jsonl") + " > " + (dir / "err.txt") + " 2>&1";
  EXPECT_NE(std::system(cmd.c_str()), 0);
  std::ifstream err(dir / "err.txt");
  const std::string text((std::istreambuf_iterator<char>(err)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("bad.jsonl:2"), std::string::npos) << text;
}

TEST(Gpt2Eval, DatasetSplitLossCountsTargetTokensOnly) {
  ASSERT_TRUE(fs::exists(eval_binary())) << eval_binary() << " (build target gpt2_eval)";
  TempDir dir;
  GPT2Config c = tiny_config(kDefaultVocab);  // the specials (50257..50259) are real tokens
  GPT2 model(c);
  model->reset_parameters(4);
  model->eval();
  save_checkpoint(dir / "ck", *model, nullptr, TrainState{});
  data::Split split;
  split.add({10, 11, 12}, {20, 21}, "a b c", "d e");
  split.add({30}, {40, 41, 42, 43}, "f", "g h");
  split.add({5, 6}, {7}, "i", "j");
  data::DatasetMeta meta;
  meta.tokenizer_identity = "test";
  meta.vocab_size = static_cast<int32_t>(kDefaultVocab);
  meta.source = "unit test";
  data::write_dataset_file(dir / "d.h5", meta,
                           {{"train", split}, {"validation", split}, {"test", split}});
  const auto b = data::make_batch(split, {0, 1, 2}, 8, meta.special);
  const std::vector<int64_t> shape = {b.batch_size, b.seq_len};
  const auto mask = torch::tensor(b.mask).view(shape);
  const double expect = model
                            ->lm_loss(model->forward(torch::tensor(b.inputs).view(shape)),
                                      torch::tensor(b.labels).view(shape), mask)
                            .item<double>();
  const std::string cmd = eval_binary() + " --checkpoint " + (dir / "ck") + " --data " +
                          (dir / "d.h5") + " --max-len 8 --batch-size 2 > " + (dir / "out.json");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const auto out = nlohmann::json::parse(std::ifstream(dir / "out.json"));
  EXPECT_EQ(out["tokens"], b.target_tokens);
  EXPECT_NEAR(out["loss"].get<double>(), expect, 1e-5);
  EXPECT_EQ(out["split"], "validation");
}

}  // namespace
}  // namespace gpt2p::model
