#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "gpt2p/core/error.h"
#include "gpt2p/model/options.h"
#include "gpt2p/parallel/train/flags.h"
#include "gpt2p/parallel/train/options.h"
#include "support/temp_dir.h"

using gpt2p::cli::UsageError;
using gpt2p::parallel::DeviceKind;
using gpt2p::parallel::GradSyncMode;
using gpt2p::parallel::Program;
using gpt2p::parallel::TrainConfig;
namespace po = gpt2p::cli::po;

namespace {

// Parses a command line given as words; returns the resolved config.
TrainConfig parse(std::vector<std::string> words, Program program = Program::kDataParallel,
                  bool cuda = false) {
  words.insert(words.begin(), "prog");
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  TrainConfig cfg;
  EXPECT_TRUE(
      gpt2p::parallel::parse_train_args(cfg, program, static_cast<int>(argv.size()), argv.data()));
  gpt2p::parallel::resolve_train_config(cfg, program, cuda);
  return cfg;
}

std::string usage_error(std::vector<std::string> words, Program program = Program::kDataParallel) {
  try {
    parse(std::move(words), program);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(TrainOptions, CpuDefaultsAreTheSmallEmbeddedRun) {
  auto c = parse({});
  EXPECT_EQ(c.compute.device, DeviceKind::kCpu);
  EXPECT_EQ(c.model.preset, "tiny");
  EXPECT_EQ(c.optim.batch_size, 16);
  EXPECT_EQ(c.output.out, "runs/dp_train");
  EXPECT_EQ(c.data_parallel.grad_sync, GradSyncMode::kBucketed);
  EXPECT_DOUBLE_EQ(c.data_parallel.bucket_mb, 25);
}

TEST(TrainOptions, CudaDefaultsFollowHw5) {
  auto c = parse({}, Program::kDataParallel, /*cuda=*/true);
  EXPECT_EQ(c.compute.device, DeviceKind::kCuda);
  EXPECT_EQ(c.model.preset, "gpt2");
  EXPECT_EQ(c.optim.batch_size, 128);
  EXPECT_EQ(c.optim.seq_len, 128);
  EXPECT_EQ(c.optim.epochs, 10);
  EXPECT_EQ(c.data.max_train_pairs, 5000);
  EXPECT_DOUBLE_EQ(c.optim.lr, 1e-4);
}

TEST(TrainOptions, ExplicitFlagsWin) {
  auto c = parse({"--preset", "gpt2", "--batch-size", "64", "--grad-sync", "per-param", "--lr",
                  "3e-4", "--device", "cpu", "--n-layer", "3"});
  EXPECT_EQ(c.model.preset, "gpt2");
  EXPECT_EQ(c.optim.batch_size, 64);
  EXPECT_EQ(c.data_parallel.grad_sync, GradSyncMode::kPerParam);
  EXPECT_DOUBLE_EQ(c.optim.lr, 3e-4);
  EXPECT_EQ(c.model.n_layer, 3);
}

TEST(TrainOptions, BadValuesNameTheFlag) {
  EXPECT_NE(usage_error({"--grad-sync", "ring"})
                .find("--grad-sync 'ring' is not one of: per-param | bucketed"),
            std::string::npos);
  EXPECT_NE(usage_error({"--schedule", "pipedream"}, Program::kPipeline)
                .find("--schedule 'pipedream' is not one of: gpipe | 1f1b | interleaved"),
            std::string::npos);
  EXPECT_NE(usage_error({"--precision", "fp8"}).find("fp32 | tf32 | bf16"), std::string::npos);
  EXPECT_NE(usage_error({"--batch-size", "abc"}).find("batch-size"), std::string::npos);
  EXPECT_NE(usage_error({"--no-such-flag"}).find("no-such-flag"), std::string::npos);
  EXPECT_NE(usage_error({"--device", "cuda"}).find("--device cpu"), std::string::npos);
  EXPECT_NE(usage_error({"--save-every", "-2"}).find("-1 (never)"), std::string::npos);
  EXPECT_EQ(usage_error({"--save-every", "-1"}), "");
}

TEST(TrainOptions, PipelineFlagsOnlyOnPpTrain) {
  EXPECT_NE(usage_error({"--microbatches", "4"}, Program::kDataParallel).find("microbatches"),
            std::string::npos);
  auto c = parse({"--microbatches", "8", "--batch-size", "32", "--schedule", "gpipe"},
                 Program::kPipeline);
  EXPECT_EQ(c.pipeline.microbatches, 8);
  EXPECT_EQ(c.pipeline.schedule, gpt2p::pipeline::ScheduleKind::kGPipe);
  EXPECT_NE(usage_error({"--microbatches", "5", "--batch-size", "32"}, Program::kPipeline)
                .find("does not divide"),
            std::string::npos);
  auto mp = parse({"--mode", "model_parallel", "--microbatches", "8"}, Program::kPipeline);
  EXPECT_EQ(mp.pipeline.microbatches, 1);
}

TEST(TrainOptions, ZeroBubbleMemoryAllowance) {
  EXPECT_EQ(parse({"--zero-bubble"}, Program::kPipeline).pipeline.zb_extra_live, 0);
  EXPECT_EQ(
      parse({"--zero-bubble", "--zb-extra-live", "-1"}, Program::kPipeline).pipeline.zb_extra_live,
      -1);
  const auto two = parse({"--zero-bubble", "--zb-extra-live", "2"}, Program::kPipeline);
  EXPECT_EQ(gpt2p::parallel::to_json(two)["zb_extra_live"], 2);
  EXPECT_NE(usage_error({"--zero-bubble", "--zb-extra-live", "-2"}, Program::kPipeline)
                .find("--zb-extra-live -2: use 0"),
            std::string::npos);
}

TEST(TrainOptions, StagesPerRankGoWithTheInterleavedSchedule) {
  EXPECT_EQ(parse({}, Program::kPipeline).pipeline.stages_per_rank, 1);
  EXPECT_EQ(parse({"--schedule", "interleaved"}, Program::kPipeline).pipeline.stages_per_rank, 2);
  EXPECT_EQ(parse({"--schedule", "interleaved", "--stages-per-rank", "3"}, Program::kPipeline)
                .pipeline.stages_per_rank,
            3);
  EXPECT_NE(usage_error({"--stages-per-rank", "2"}, Program::kPipeline)
                .find("--stages-per-rank 2 does not fit --schedule 1f1b"),
            std::string::npos);
  EXPECT_NE(usage_error({"--schedule", "interleaved", "--stages-per-rank", "1"}, Program::kPipeline)
                .find("2 or more with interleaved"),
            std::string::npos);
  // model_parallel runs one micro-batch on one stage per rank whatever the schedule says.
  const auto mp =
      parse({"--mode", "model_parallel", "--schedule", "interleaved"}, Program::kPipeline);
  EXPECT_EQ(mp.pipeline.stages_per_rank, 1);
  EXPECT_EQ(mp.pipeline.schedule, gpt2p::pipeline::ScheduleKind::kOneFOneB);
  EXPECT_EQ(gpt2p::parallel::to_json(
                parse({"--schedule", "interleaved"}, Program::kPipeline))["stages_per_rank"],
            2);
}

TEST(TrainOptions, ConfigRoundTripsToJson) {
  auto c = parse({"--seed", "7"});
  auto j = gpt2p::parallel::to_json(c);
  EXPECT_EQ(j["seed"].get<uint64_t>(), 7U);
  EXPECT_EQ(j["preset"], "tiny");
  // Enum-valued options are recorded by name.
  EXPECT_EQ(j["precision"], "fp32");
  EXPECT_EQ(j["device"], "cpu");
  EXPECT_EQ(j["kernels"], "auto");
  EXPECT_EQ(j["grad_sync"], "bucketed");
}

// A run writes its resolved options as <out>/config.ini (parallel/train/flags.h): --config on that
// file alone gives the same resolved options, for every program, non-default values included.
TEST(TrainOptions, TheWrittenConfigFileRunsTheSameConfigurationAgain) {
  const std::vector<std::pair<Program, std::vector<std::string>>> runs = {
      {Program::kSingle, {"--epochs", "3", "--lr", "3e-4", "--n-layer", "3", "--out", "r/one"}},
      {Program::kDataParallel,
       {"--grad-sync", "per-param", "--precision", "bf16", "--loss-scale", "dynamic", "--dropout",
        "0", "--profile", "p d", "--seed", "42", "--init-from", "x/ck"}},
      {Program::kPipeline,
       {"--schedule", "interleaved", "--microbatches", "4", "--zero-bubble", "--dp", "2", "--zero",
        "1", "--bucket-mb", "0.5", "--partition", "uniform", "--comm-timeout", "7.25"}},
      {Program::kPipeline, {"--mode", "model_parallel", "--resume", "a/checkpoint"}},
  };
  for (const auto& [program, words] : runs) {
    const TrainConfig first = parse(words, program);
    const std::string text = gpt2p::parallel::to_config_file(first, program);
    gpt2p::testing::TempDir dir("config_file");
    const std::string file = dir / "config.ini";
    std::ofstream(file) << text;
    TrainConfig again = parse({"--config", file}, program);
    // --resume and --overwrite describe one start, not the run: not in the file.
    again.output.resume = first.output.resume;
    EXPECT_EQ(gpt2p::parallel::to_json(again), gpt2p::parallel::to_json(first))
        << gpt2p::parallel::program_name(program) << ":\n"
        << text;
    EXPECT_EQ(text.find("resume"), std::string::npos) << text;
  }
}

// Every flag of a program is in the config file its run writes, but the two about one start
// (--resume, --overwrite) and, while they hold "not given", the model overrides and optional paths;
// the file lists them in the order of --help.
TEST(TrainOptions, TheWrittenConfigFileHoldsEveryFlagButTheOnesAboutOneStart) {
  const std::set<std::string> about_one_start = {"resume", "overwrite"};
  const std::set<std::string> when_given = {"n-layer", "n-head",    "n-embd",
                                            "dropout", "init-from", "profile"};
  const auto keys_of = [](const std::string& text) {
    std::vector<std::string> keys;
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);) {
      if (!line.empty() && line[0] != '#') keys.push_back(line.substr(0, line.find(" = ")));
    }
    return keys;
  };
  for (const Program program : {Program::kSingle, Program::kDataParallel, Program::kPipeline}) {
    const std::string name = gpt2p::parallel::program_name(program);
    po::options_description desc;
    TrainConfig scratch;
    gpt2p::parallel::add_train_options(desc, scratch, program);
    std::vector<std::string> every, written, written_by_default;
    for (const auto& d : desc.options()) {
      every.push_back(d->long_name());
      if (about_one_start.count(d->long_name()) != 0U) continue;
      written.push_back(d->long_name());
      if (when_given.count(d->long_name()) == 0U) written_by_default.push_back(d->long_name());
    }
    EXPECT_EQ(every.size(), written.size() + about_one_start.size()) << name;
    const TrainConfig all_given =
        parse({"--n-layer", "3", "--n-head", "2", "--n-embd", "64", "--dropout", "0", "--init-from",
               "x/ck", "--profile", "p", "--resume", "a/checkpoint", "--overwrite"},
              program);
    const auto expect_keys = [&name](const std::vector<std::string>& keys,
                                     const std::vector<std::string>& flags) {
      std::string missing;
      for (const auto& f : flags) {
        if (std::find(keys.begin(), keys.end(), f) == keys.end()) missing += " " + f;
      }
      EXPECT_EQ(keys, flags) << name << "'s config file has no line for:" << missing;
    };
    expect_keys(keys_of(gpt2p::parallel::to_config_file(all_given, program)), written);
    expect_keys(keys_of(gpt2p::parallel::to_config_file(parse({}, program), program)),
                written_by_default);
  }
}

TEST(TrainOptions, HelpShowsEveryNameFromItsTable) {
  std::vector<std::string> words{"prog", "--help"};
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  testing::internal::CaptureStdout();
  TrainConfig cfg;
  EXPECT_FALSE(gpt2p::parallel::parse_train_args(cfg, Program::kPipeline, 2, argv.data()));
  const std::string help = testing::internal::GetCapturedStdout();
  EXPECT_NE(help.find("--precision arg (=fp32)"), std::string::npos) << help;
  EXPECT_NE(help.find("fp32 | tf32 | bf16"), std::string::npos) << help;
  EXPECT_NE(help.find("--schedule arg (=1f1b)"), std::string::npos) << help;
  EXPECT_NE(help.find("gpipe | 1f1b | interleaved"), std::string::npos) << help;
  EXPECT_NE(help.find("--partition arg (=balanced)"), std::string::npos) << help;
}

TEST(TrainOptions, OutOfRangeValuesAreRefusedNotTakenAsDefaults) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--batch-size", "-4"}, "--batch-size -4 is out of range: use a value > 0"},
      {{"--batch-size", "-1"}, "--batch-size -1 is out of range"},
      {{"--epochs", "-3"}, "--epochs -3 is out of range"},
      {{"--epochs", "0"}, "--epochs 0 is out of range"},
      {{"--seq-len", "-5"}, "--seq-len -5 is out of range: use a length >= 2"},
      {{"--max-train-pairs", "-9"}, "--max-train-pairs -9 is out of range: use a count >= 0"},
      {{"--max-eval-pairs", "-1"}, "--max-eval-pairs -1 is out of range"},
      {{"--n-layer", "-3"}, "--n-layer -3 is out of range"},
      {{"--n-head", "0"}, "--n-head 0 is out of range"},
      {{"--n-embd", "-64"}, "--n-embd -64 is out of range"},
      {{"--dropout", "-0.5"}, "--dropout -0.5 is out of range: use a probability in [0, 1)"},
      {{"--dropout", "1"}, "--dropout 1 is out of range"},
      {{"--translate-samples", "-2"}, "--translate-samples -2 is out of range"},
      {{"--log-every", "0"}, "--log-every 0 is out of range"},
      {{"--grad-clip", "-1"}, "--grad-clip -1 is out of range: use a norm >= 0 (0 = off)"},
      {{"--weight-decay", "-0.1"}, "--weight-decay -0.1 is out of range"},
      {{"--bucket-mb", "-25"}, "--bucket-mb -25 is out of range"},
      {{"--warmup-epochs", "-1"}, "--warmup-epochs -1 is out of range"},
  };
  for (const auto& [words, expected] : cases) {
    EXPECT_NE(usage_error(words).find(expected), std::string::npos)
        << words[0] << " " << words[1] << ": got '" << usage_error(words) << "'";
  }
}

TEST(TrainOptions, BoundaryValuesInRangeAreAccepted) {
  const auto c = parse({"--dropout", "0", "--max-train-pairs", "0", "--max-eval-pairs", "0",
                        "--translate-samples", "0", "--grad-clip", "0", "--weight-decay", "0",
                        "--seq-len", "2", "--warmup-epochs", "0"});
  EXPECT_DOUBLE_EQ(c.model.dropout, 0);
  EXPECT_EQ(c.data.max_train_pairs, 0);
  EXPECT_EQ(c.output.translate_samples, 0);
  EXPECT_EQ(c.optim.seq_len, 2);
  EXPECT_DOUBLE_EQ(parse({"--dropout", "0.99"}).model.dropout, 0.99);
}

TEST(Kernels, AutoTakesTheReferenceKernelsOnGpusOlderThanSm80) {
  using gpt2p::model::Kernels;
  using gpt2p::model::kernels_fallback_reason;
  using gpt2p::model::Precision;
  using gpt2p::model::resolve_kernels;
  // A CUDA build (built = true) on an H200 (9.0), an A100 (8.0) and a V100 (7.0).
  EXPECT_EQ(resolve_kernels(Kernels::kAuto, {true, 90, Precision::kFp32, true}), Kernels::kFused);
  EXPECT_EQ(resolve_kernels(Kernels::kAuto, {true, 80, Precision::kFp32, true}), Kernels::kFused);
  EXPECT_EQ(resolve_kernels(Kernels::kAuto, {true, 70, Precision::kFp32, true}),
            Kernels::kReference);
  EXPECT_EQ(kernels_fallback_reason(Kernels::kAuto, {true, 70, Precision::kFp32, true}),
            "sm_70 is older than the fused kernels' sm_80");
  EXPECT_EQ(kernels_fallback_reason(Kernels::kAuto, {true, 90, Precision::kFp32, true}), "");
  EXPECT_EQ(kernels_fallback_reason(Kernels::kReference, {true, 70, Precision::kFp32, true}), "");
  EXPECT_EQ(kernels_fallback_reason(Kernels::kAuto, {false, 0, Precision::kFp32, true}),
            "");  // the CPU: no note
  EXPECT_EQ(resolve_kernels(Kernels::kReference, {true, 70, Precision::kFp32, true}),
            Kernels::kReference);
  try {
    resolve_kernels(Kernels::kFused, {true, 70, Precision::kFp32, true});
    ADD_FAILURE() << "--kernels fused on sm_70 was accepted";
  } catch (const gpt2p::Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs a GPU of compute capability 8.0 or newer; this "
                                         "one is 7.0"),
              std::string::npos)
        << e.what();
  }
  // The CPU, and a build without the kernels.
  EXPECT_EQ(resolve_kernels(Kernels::kAuto, {false, 0, Precision::kFp32, true}),
            Kernels::kReference);
  EXPECT_EQ(resolve_kernels(Kernels::kAuto, {true, 90, Precision::kFp32, false}),
            Kernels::kReference);
}

TEST(Kernels, Fp16RunsOnTheReferenceKernels) {
  using gpt2p::model::Kernels;
  using gpt2p::model::kernels_fallback_reason;
  using gpt2p::model::Precision;
  using gpt2p::model::resolve_kernels;
  EXPECT_EQ(resolve_kernels(Kernels::kAuto, {true, 90, Precision::kFp16, true}),
            Kernels::kReference);
  EXPECT_EQ(kernels_fallback_reason(Kernels::kAuto, {true, 90, Precision::kFp16, true}),
            "fp16 runs on the reference kernels");
  EXPECT_EQ(resolve_kernels(Kernels::kAuto, {true, 90, Precision::kBf16, true}), Kernels::kFused);
  try {
    resolve_kernels(Kernels::kFused, {true, 90, Precision::kFp16, true});
    ADD_FAILURE() << "--kernels fused with fp16 was accepted";
  } catch (const gpt2p::Error& e) {
    EXPECT_NE(std::string(e.what()).find("--kernels fused with --precision fp16: the fused "
                                         "kernels compute in float32 or bfloat16"),
              std::string::npos)
        << e.what();
  }
}

TEST(Precision, DevicesRefuseTheHalfTypesTheyLack) {
  using gpt2p::model::check_precision;
  using gpt2p::model::Precision;
  const auto refusal = [](Precision p, bool cuda, int capability) {
    try {
      check_precision(p, cuda, capability);
    } catch (const gpt2p::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(refusal(Precision::kFp16, true, 70), "");  // a V100
  EXPECT_EQ(refusal(Precision::kFp16, true, 90), "");
  EXPECT_EQ(refusal(Precision::kBf16, true, 80), "");
  EXPECT_EQ(refusal(Precision::kBf16, false, 0), "");  // CPU autocast has bf16
  EXPECT_EQ(refusal(Precision::kFp32, true, 70), "");
  EXPECT_NE(
      refusal(Precision::kFp16, false, 0).find("--precision fp16 autocasts on CUDA GPUs only"),
      std::string::npos);
  EXPECT_NE(refusal(Precision::kBf16, true, 70)
                .find("--precision bf16 needs a GPU with bfloat16 tensor cores (compute "
                      "capability 8.0 or newer); this one is 7.0 -- fix: pass --precision fp16"),
            std::string::npos)
      << refusal(Precision::kBf16, true, 70);
}
