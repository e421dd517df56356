// pp_plan: which split, schedule and micro-batch count to give pp_train, from layer times measured
// on this device (one GPU or the CPU) and the pipeline simulator: predicted step time, speed-up
// over model parallelism and idle fraction for every combination, before any multi-GPU time is
// spent.
//
//   pp_plan --stages 2 --batch-size 64 --seq-len 128 --precision fp32 --microbatches 1,2,4,8,16
//   pp_plan --gpus 4 --batch-size 64 ...    every D x P = 4 (pp_train --dp D on P-rank pipelines)
//
// The prediction assumes identical devices per stage, backward = 2/3 of a layer's forward +
// backward time, and --link-gbs for activation/gradient transfers. Each step ends with every
// stage's work after the schedule (gradient norm and clip, AdamW, zeroing), timed with the
// trainer's own functions and scaled to each stage's parameters; it leaves out the tied-weight
// exchange and the loss broadcast. Each plan also
// gets its busiest rank's peak memory (pipeline/perf/memory.h): fp32 weights, gradients and AdamW
// moments (sharded over the replicas with --zero 1) plus the activations its schedule keeps, as
// the CUDA allocator counts them for each layer, or estimated from the shapes on the CPU. On a GPU
// the layers run as pp_train would run the plan's stages: as CUDA graphs under --cuda-graphs auto
// where nothing keeps them eager (planner.h: plan_graph_blocker), else launched one by one. The
// planner, the --gpus search and the tables are pipeline/perf's (planner.h, hybrid.h,
// plan_report.h); this file reads the flags and calls them.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>

#include "gpt2p/cli/main_guard.h"
#include "gpt2p/cli/options.h"
#include "gpt2p/compat/adamw.h"
#include "gpt2p/compat/device.h"
#include "gpt2p/compat/profiler.h"
#include "gpt2p/core/atomic_file.h"
#include "gpt2p/core/error.h"
#include "gpt2p/data/batch.h"
#include "gpt2p/data/dataset_file.h"
#include "gpt2p/model/gpt2.h"
#include "gpt2p/parallel/data_parallel/reducer.h"
#include "gpt2p/parallel/data_parallel/replica_grad_sync.h"
#include "gpt2p/parallel/train/context.h"
#include "gpt2p/parallel/train/options.h"
#include "gpt2p/pipeline/perf/hybrid.h"
#include "gpt2p/pipeline/perf/plan_report.h"
#include "gpt2p/pipeline/perf/planner.h"

namespace {

using gpt2p::cli::UsageError;

struct Flags {
  gpt2p::model::Precision precision = gpt2p::model::Precision::kFp32;
  gpt2p::model::Kernels kernels = gpt2p::model::Kernels::kAuto;
  gpt2p::parallel::DeviceKind device = gpt2p::parallel::DeviceKind::kAuto;
  std::string json_out;
  std::string profile;         // --profile DIR: a Chrome trace of the layer profile
  int gpus = 0;                // > 0: predict every D x P split of this many GPUs
  double allreduce_gbs = 250;  // bus bandwidth of the replicas' gradient all-reduce
  std::string data = ".cache/data/ding-gpt2.h5";
  int64_t max_train_pairs = 5000;
  double loss_fraction = -1;  // -1: from --data
  int64_t vocab_size = 50260;
  gpt2p::parallel::TrainConfig train;  // its model section: preset and overrides, as the trainers
  gpt2p::model::GPT2Config config;     // train.model resolved at --seq-len (parse_flags)
  gpt2p::pipeline::PlanSpec spec;
};

// A flag's double as given ("0.5", "nan", "-1"), for messages; std::to_string pads "0.500000".
std::string number(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

std::vector<int> parse_list(const std::string& flag, const std::string& text, int min = 1) {
  std::vector<int> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      const int v = std::stoi(item, &used);
      if (used != item.size() || v < min) throw std::invalid_argument(item);
      out.push_back(v);
    } catch (const std::exception&) {
      throw UsageError("--" + flag + " '" + text + "': use integers >= " + std::to_string(min) +
                       " separated by commas, e.g. " + (min < 1 ? "0,2,-1" : "1,2,4,8"));
    }
  }
  if (out.empty()) throw UsageError("--" + flag + " is empty: give at least one value, e.g. 4");
  return out;
}

bool parse_flags(int argc, char** argv, Flags& f) {
  namespace po = gpt2p::cli::po;
  auto& s = f.spec;
  std::string ms = "1,2,4,8,16", vs = "1,2", zbs = "0";
  po::options_description desc("pp_plan options");
  // clang-format off
  desc.add_options()
      ("preset", po::value(&f.train.model.preset), "tiny | gpt2 | gpt2-medium | gpt2-large | gpt2-xl (default: gpt2 on cuda, tiny on cpu)")
      ("n-layer", po::value(&f.train.model.n_layer), "override: number of transformer blocks")
      ("n-embd", po::value(&f.train.model.n_embd), "override: embedding width")
      ("n-head", po::value(&f.train.model.n_head), "override: attention heads")
      ("dropout", po::value(&f.train.model.dropout), "override: dropout probability (preset: 0.1)")
      ("vocab-size", po::value(&f.vocab_size)->default_value(f.vocab_size), "tokens in the vocabulary (GPT-2's 50257 + our 3 specials)")
      ("stages", po::value(&s.stages)->default_value(s.stages), "pipeline stages (pp_train's ranks)")
      ("batch-size", po::value(&s.batch_size)->default_value(s.batch_size), "global batch, sequences per step")
      ("seq-len", po::value(&s.seq_len)->default_value(s.seq_len), "tokens per sequence")
      ("precision", gpt2p::cli::named_value(f.precision, "precision"), "as pp_train's --precision")
      ("kernels", gpt2p::cli::named_value(f.kernels, "kernels"), "as pp_train's --kernels: auto | fused | reference; the layers are timed on the path training runs")
      ("device", gpt2p::cli::named_value(f.device, "device"), "where the layers are timed (auto: cuda when built with CUDA and a GPU is present)")
      ("cuda-graphs", gpt2p::cli::named_value(f.train.compute.cuda_graphs, "cuda-graphs"), "as pp_train's --cuda-graphs: auto = on a GPU, time the layers as CUDA graphs where pp_train runs the plan's stages so (--loss-fraction 1, without --recompute, --zero-bubble or replicas; the table's header says which), off = launched eagerly")
      ("microbatches", po::value(&ms)->default_value(ms), "micro-batch counts M to predict, comma-separated (each must divide --batch-size)")
      ("stages-per-rank", po::value(&vs)->default_value(vs), "stages per rank V to predict, comma-separated: 1 = gpipe and 1f1b, 2 or more = interleaved 1F1B on stages x V stages (M a multiple of --stages)")
      ("zero-bubble", po::bool_switch(&s.zero_bubble), "also predict every pipeline row with pp_train --zero-bubble (split backwards, W's in the bubbles)")
      ("zb-extra-live", po::value(&zbs)->default_value(zbs), "with --zero-bubble: pp_train --zb-extra-live values to predict, comma-separated (0 = the memory of the schedule without --zero-bubble, -1 = no limit)")
      ("recompute", gpt2p::cli::named_value(s.recompute, "recompute"), "as pp_train's --recompute: none | blocks (each block's activations recomputed in backward: less memory, one more forward of the blocks per micro-batch)")
      ("zero", po::value(&s.zero)->default_value(s.zero), "as pp_train's --zero: 1 = AdamW's moments sharded over the D replicas of --gpus (no effect where D = 1), 0 = not sharded")
      ("link-gbs", po::value(&s.link_gbs)->default_value(s.link_gbs), "GB/s of one activation or gradient transfer between stages (NVLink on H200: ~250)")
      ("gpus", po::value(&f.gpus)->default_value(f.gpus), "instead of one --stages: every split of this many GPUs into D data-parallel replicas of a P-rank pipeline (pp_train --dp D), each at its fastest plan for a replica's batch, plus the replicas' gradient all-reduce; prints which it would pick")
      ("allreduce-gbs", po::value(&f.allreduce_gbs)->default_value(f.allreduce_gbs), "with --gpus: NCCL all-reduce bus bandwidth between replicas in GB/s (comm_bench's busbw; 2 x H200 over NVLink: ~310)")
      ("reps", po::value(&s.reps)->default_value(s.reps), "timed iterations per round of the layer profile")
      ("loss-positions", gpt2p::cli::named_value(s.loss_positions, "loss-positions"), "as pp_train's --loss-positions: targets = the head runs at the positions whose loss counts (--loss-fraction of them), all = at every position, the loss still counting --loss-fraction of them (its cross-entropy skips the rest)")
      ("loss-fraction", po::value(&f.loss_fraction), "share of positions whose loss counts. Default: the share in --data's first --max-train-pairs pairs at --seq-len, as pp_train prints it; 1 when that file is missing. 1 with --loss-positions targets: the head at every position, every one counted")
      ("data", po::value(&f.data)->default_value(f.data), "prepared dataset the default --loss-fraction is read from")
      ("max-train-pairs", po::value(&f.max_train_pairs)->default_value(f.max_train_pairs), "training pairs of --data counted (pp_train's --max-train-pairs; 0 = all)")
      ("json-out", po::value(&f.json_out)->default_value(""), "also write every prediction to this JSON file (atomically)")
      ("profile", po::value(&f.profile)->default_value(""), "write a Chrome trace of the layer profile's operators and CUDA kernels (libtorch's profiler) to DIR/trace.json, to compare the parts timed alone with a trainer's --profile of the same layers (analysis/kernel_table.py)");
  // clang-format on
  po::variables_map vm;
  if (!gpt2p::cli::parse_or_help("pp_plan",
                                 "Predicted pp_train step times per split, schedule and M, from "
                                 "layer times measured on this device.",
                                 desc, argc, argv, vm)) {
    return false;
  }
  s.microbatches = parse_list("microbatches", ms);
  s.stages_per_rank = parse_list("stages-per-rank", vs);
  s.zb_extra_live = parse_list("zb-extra-live", zbs, -1);
  const bool cuda = gpt2p::compat::cuda_available();
  using gpt2p::parallel::DeviceKind;
  if (f.device == DeviceKind::kAuto) f.device = cuda ? DeviceKind::kCuda : DeviceKind::kCpu;
  if (f.device == DeviceKind::kCuda && !cuda)
    throw UsageError(
        "--device cuda: this build has no CUDA or no GPU is visible (pass --device cpu)");
  if (f.kernels == gpt2p::model::Kernels::kFused && f.device != DeviceKind::kCuda)
    throw UsageError(
        "--kernels fused: the fused kernels run on a GPU only (pass --device cuda, or "
        "--kernels auto or reference)");
  if (f.train.model.preset.empty())
    f.train.model.preset = f.device == DeviceKind::kCuda ? "gpt2" : "tiny";
  s.precision = f.precision;
  s.cuda_graphs = f.train.compute.cuda_graphs == gpt2p::parallel::CudaGraphs::kAuto;
  if (s.stages < 1)
    throw UsageError("--stages " + std::to_string(s.stages) + ": run at least one stage");
  if (s.batch_size < 1)
    throw UsageError("--batch-size " + std::to_string(s.batch_size) + ": pass a positive batch");
  if (s.seq_len < 1)
    throw UsageError("--seq-len " + std::to_string(s.seq_len) + ": pass a positive length");
  if (s.reps < 1) throw UsageError("--reps must be at least 1");
  // nan and inf pass a plain `<= 0` test and would reach the simulator as transfer times.
  if (!(std::isfinite(s.link_gbs) && s.link_gbs > 0))
    throw UsageError("--link-gbs " + number(s.link_gbs) +
                     ": pass a finite bandwidth > 0 in GB/s, e.g. 250");
  if (f.gpus < 0) throw UsageError("--gpus " + std::to_string(f.gpus) + ": pass a GPU count >= 1");
  if (!(std::isfinite(f.allreduce_gbs) && f.allreduce_gbs > 0))
    throw UsageError("--allreduce-gbs " + number(f.allreduce_gbs) +
                     ": pass a finite bandwidth > 0 in GB/s, e.g. 310");
  // The model overrides: a value <= 0 inside TrainConfig means "the preset's", so one given on the
  // command line is checked here, or --n-layer 0 would silently time the preset's model.
  const std::pair<const char*, int> overrides[] = {{"n-layer", f.train.model.n_layer},
                                                   {"n-embd", f.train.model.n_embd},
                                                   {"n-head", f.train.model.n_head}};
  for (const auto& [flag, value] : overrides) {
    if (vm.count(flag) && value < 1)
      throw UsageError("--" + std::string(flag) + " " + std::to_string(value) +
                       ": pass a value >= 1, or leave the flag out for the preset's");
  }
  if (vm.count("dropout") && !(f.train.model.dropout >= 0 && f.train.model.dropout < 1))
    throw UsageError("--dropout " + number(f.train.model.dropout) +
                     ": pass a probability in [0, 1), or leave the flag out for the preset's");
  if (f.vocab_size < 1)
    throw UsageError("--vocab-size " + std::to_string(f.vocab_size) +
                     ": pass a token count >= 1, e.g. 50260");
  if (f.max_train_pairs < 0)
    throw UsageError("--max-train-pairs " + std::to_string(f.max_train_pairs) +
                     ": pass a pair count >= 0 (0 = all)");
  if (s.zero != 0 && s.zero != 1)
    throw UsageError("--zero " + std::to_string(s.zero) + ": pass 0 or 1");
  if (!f.profile.empty()) {
    std::error_code ec;
    if (std::filesystem::exists(f.profile, ec) && !std::filesystem::is_directory(f.profile, ec))
      throw UsageError("--profile " + f.profile +
                       ": not a directory; name a folder for trace.json");
    gpt2p::compat::Profiler::require_available();
  }
  if (vm.count("loss-fraction") && !(f.loss_fraction > 0 && f.loss_fraction <= 1))
    throw UsageError("--loss-fraction " + std::to_string(f.loss_fraction) +
                     ": pass a share in (0, 1], e.g. 0.094");
  for (int m : s.microbatches) {
    if (f.gpus == 0 && s.batch_size % m != 0)
      throw UsageError("--microbatches: " + std::to_string(m) + " does not divide --batch-size " +
                       std::to_string(s.batch_size) + "; drop it or change the batch");
  }
  // The model as the trainers build it; a bad --preset or n_embd not divisible by n_head is a
  // usage error here, not a runtime one after the data file was read.
  gpt2p::parallel::TrainConfig model = f.train;
  model.optim.seq_len = s.seq_len;
  try {
    f.config = gpt2p::parallel::model_config_for(model, f.vocab_size);
  } catch (const gpt2p::Error& e) {
    throw UsageError(e.what_happened() + " -- fix: " + e.hint());
  }
  // A request with nothing to predict, refused before the layer profile runs.
  if (f.gpus == 0) {
    if (s.stages > f.config.n_layer)
      throw UsageError("--stages " + std::to_string(s.stages) + ": more pipeline stages than " +
                       "the model's " + std::to_string(f.config.n_layer) +
                       " blocks -- fix: " + "pass --stages <= " + std::to_string(f.config.n_layer) +
                       " or a larger --n-layer");
    const std::string why = gpt2p::pipeline::why_no_plan(s, f.config.n_layer);
    if (!why.empty())
      throw UsageError("--stages " + std::to_string(s.stages) + " --stages-per-rank " + vs +
                       ": no plan fits: " + why + " -- fix: add 1 to --stages-per-rank, or " +
                       "change --stages, --microbatches or --n-layer to fit");
  } else {
    const std::string why = gpt2p::pipeline::why_no_hybrid_plan(s, f.gpus, f.config.n_layer);
    if (!why.empty())
      throw UsageError("--gpus " + std::to_string(f.gpus) + ": no D x P split fits the other " +
                       "flags: " + why + " -- fix: pass a --gpus with a D that divides " +
                       "--batch-size and P <= n_layer, or change --batch-size, --n-layer or " +
                       "--stages-per-rank");
  }
  return true;
}

// --loss-fraction, or the share of target positions in --data's first --max-train-pairs pairs.
double loss_fraction(const Flags& f) {
  if (f.loss_fraction > 0) return f.loss_fraction;
  if (!std::filesystem::exists(f.data)) {
    std::printf("# %s is missing: the head is timed at every position (pass --loss-fraction)\n",
                f.data.c_str());
    return 1.0;
  }
  const auto file = gpt2p::data::DatasetFile::open(f.data);
  const auto& train = file.split("train");
  const int64_t pairs =
      f.max_train_pairs > 0 ? std::min(f.max_train_pairs, train.size()) : train.size();
  return gpt2p::data::target_share(
      gpt2p::data::target_counts(train, pairs, f.spec.seq_len, file.meta().special),
      f.spec.seq_len);
}

int run(Flags f) {
  namespace pl = gpt2p::pipeline;
  f.spec.loss_fraction = loss_fraction(f);
  const auto& config = f.config;
  const c10::Device device = f.device == gpt2p::parallel::DeviceKind::kCuda
                                 ? c10::Device(c10::kCUDA, 0)
                                 : c10::Device(c10::kCPU);
  gpt2p::model::check_precision(f.precision, device.is_cuda(),
                                gpt2p::compat::compute_capability(device));
  gpt2p::compat::set_strict_fp32(f.precision == gpt2p::model::Precision::kFp32);
  // The path pp_train would run with the same --kernels on this device.
  gpt2p::model::KernelTarget target;
  target.cuda_device = device.is_cuda();
  target.capability = gpt2p::compat::compute_capability(device);
  target.precision = f.precision;
  f.spec.kernels = gpt2p::model::resolve_kernels(f.kernels, target);
  const std::string where = device.is_cuda() ? gpt2p::compat::device_name(device) : "cpu";
  // The layer timing takes minutes for GPT-2 124M on a CPU: say what runs, on stderr.
  const auto started = std::chrono::steady_clock::now();
  f.spec.progress = [&](const std::string& what) {
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    std::fprintf(stderr, "pp_plan: %s on %s (%.0f s so far)\n", what.c_str(), where.c_str(), s);
  };
  // What pp_train does on each stage of one replica once its schedule ends, with its own
  // objects: the gradient norm and clip at its default --grad-clip, then the stage's reducer (one
  // rank: none) steps AdamW and zeroes .grad in place, as a graphed stage does.
  f.spec.step_tail = [&f](gpt2p::model::GPT2& part) -> std::function<void()> {
    gpt2p::parallel::ReducerOptions one_rank;
    one_rank.kind = gpt2p::parallel::ReducerKind::kNone;
    std::shared_ptr<gpt2p::parallel::GradReducer> reducer = gpt2p::parallel::make_reducer(
        part->parameters(), gpt2p::parallel::make_adamw(f.train, part->parameters()), one_rank);
    const std::vector<gpt2p::model::GPT2> stages{part};
    const double clip = f.train.optim.grad_clip;
    return [reducer, stages, clip] {
      if (clip > 0) gpt2p::parallel::clip_grad_norm_pipeline(stages, nullptr, clip);
      reducer->step();
      reducer->zero_grad_in_place();
    };
  };
  std::optional<gpt2p::compat::Profiler> profiler;
  if (!f.profile.empty()) {
    std::filesystem::create_directories(f.profile);
    profiler.emplace(device);
    profiler->start();
  }
  nlohmann::json doc;
  if (f.gpus > 0) {
    pl::print_hybrid_header(stdout, f.gpus, f.spec);
    const pl::HybridPlan hybrid = pl::plan_hybrid(config, f.spec, f.gpus, f.allreduce_gbs, device);
    pl::print_hybrid(stdout, hybrid, f.spec);
    if (!f.json_out.empty()) doc = pl::hybrid_document(hybrid, f.spec, config);
  } else {
    const pl::Plan plan = pl::make_plan(config, f.spec, device);
    // parse_flags refused the requests without rows; this is only a safety net.
    GPT2P_CHECK(!plan.rows.empty(), "pp_plan: no plan for --stages " << f.spec.stages,
                "change --stages, --stages-per-rank or --microbatches");
    pl::print_plan(stdout, plan, f.spec, config, where);
    if (!f.json_out.empty()) doc = pl::plan_document(plan, f.spec, config, where);
  }
  if (profiler) {
    const std::string trace = (std::filesystem::path(f.profile) / "trace.json").string();
    profiler->stop(trace);
    std::printf("# profile of the layer timing written to %s\n", trace.c_str());
  }
  if (!f.json_out.empty()) gpt2p::write_text_atomically(f.json_out, doc.dump(2) + "\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return gpt2p::cli::run_guarded("pp_plan", argc, argv,
                                 [](const gpt2p::Topology&, int argc, char** argv) {
                                   Flags f;
                                   return parse_flags(argc, argv, f) ? run(f) : 0;
                                 });
}
