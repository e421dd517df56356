// pp_plan: which split, schedule and micro-batch count to give pp_train, from layer times measured
// on this device (one GPU or the CPU) and the pipeline simulator: predicted step time, speed-up over
// model parallelism and idle fraction for every combination, before any multi-GPU time is spent.
//
//   pp_plan --stages 2 --batch-size 64 --seq-len 128 --precision fp32 --microbatches 1,2,4,8,16
//
// The prediction assumes identical devices per stage, backward = 2/3 of a layer's forward +
// backward time, and --link-gbs for activation/gradient transfers; it leaves out the optimizer
// step, the tied-weight exchange and the loss broadcast (the same for every plan).
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "gpt2p/cli/main_guard.h"
#include "gpt2p/cli/options.h"
#include "gpt2p/core/atomic_file.h"
#include "gpt2p/core/compat.h"
#include "gpt2p/model/config.h"
#include "gpt2p/pipeline/layer_profile.h"
#include "gpt2p/pipeline/partition.h"
#include "gpt2p/pipeline/predict.h"

namespace {

using gpt2p::cli::UsageError;
namespace pl = gpt2p::pipeline;

struct PlanConfig {
  std::string preset, precision = "fp32", device = "auto", json_out;
  int64_t n_layer = 0, n_embd = 0, n_head = 0, vocab_size = 50260, batch_size = 64, seq_len = 128;
  int stages = 2, reps = 5;
  double link_gbs = 200;
  std::vector<int> microbatches;
};

std::vector<int> parse_list(const std::string& flag, const std::string& text) {
  std::vector<int> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      const int v = std::stoi(item, &used);
      if (used != item.size() || v < 1) throw std::invalid_argument(item);
      out.push_back(v);
    } catch (const std::exception&) {
      throw UsageError("--" + flag + " '" + text + "': use positive integers separated by commas, e.g. 1,2,4,8");
    }
  }
  if (out.empty()) throw UsageError("--" + flag + " is empty: give at least one value, e.g. 4");
  return out;
}

bool parse_flags(int argc, char** argv, PlanConfig& c) {
  namespace po = gpt2p::cli::po;
  std::string ms = "1,2,4,8,16";
  po::options_description desc("pp_plan options");
  desc.add_options()
      ("preset", po::value(&c.preset), "tiny | gpt2 | gpt2-medium | gpt2-large | gpt2-xl (default: gpt2 on cuda, tiny on cpu)")
      ("n-layer", po::value(&c.n_layer), "override: number of transformer blocks")
      ("n-embd", po::value(&c.n_embd), "override: embedding width")
      ("n-head", po::value(&c.n_head), "override: attention heads")
      ("vocab-size", po::value(&c.vocab_size)->default_value(c.vocab_size), "tokens in the vocabulary (GPT-2's 50257 + our 3 specials)")
      ("stages", po::value(&c.stages)->default_value(c.stages), "pipeline stages (pp_train's ranks)")
      ("batch-size", po::value(&c.batch_size)->default_value(c.batch_size), "global batch, sequences per step")
      ("seq-len", po::value(&c.seq_len)->default_value(c.seq_len), "tokens per sequence")
      ("precision", po::value(&c.precision)->default_value(c.precision), "fp32 | tf32 | bf16 (autocast), as pp_train")
      ("device", po::value(&c.device)->default_value(c.device), "auto | cpu | cuda: where the layers are timed")
      ("microbatches", po::value(&ms)->default_value(ms), "micro-batch counts M to predict, comma-separated (each must divide --batch-size)")
      ("link-gbs", po::value(&c.link_gbs)->default_value(c.link_gbs), "GB/s of one activation or gradient transfer between stages (NVLink on H200: ~250)")
      ("reps", po::value(&c.reps)->default_value(c.reps), "timed iterations per round of the layer profile")
      ("json-out", po::value(&c.json_out)->default_value(""), "also write every prediction to this JSON file (atomically)");
  po::variables_map vm;
  if (!gpt2p::cli::parse_or_help("pp_plan",
                                 "Predicted pp_train step times per split, schedule and M, from layer "
                                 "times measured on this device.",
                                 desc, argc, argv, vm)) {
    return false;
  }
  c.microbatches = parse_list("microbatches", ms);
  if (c.device == "auto") c.device = gpt2p::compat::cuda_available() ? "cuda" : "cpu";
  if (c.device != "cpu" && c.device != "cuda") throw UsageError("--device '" + c.device + "': use auto, cpu or cuda");
  if (c.device == "cuda" && !gpt2p::compat::cuda_available())
    throw UsageError("--device cuda: this build has no CUDA or no GPU is visible (pass --device cpu)");
  if (c.preset.empty()) c.preset = c.device == "cuda" ? "gpt2" : "tiny";
  if (c.precision != "fp32" && c.precision != "tf32" && c.precision != "bf16")
    throw UsageError("--precision '" + c.precision + "': use fp32, tf32 or bf16");
  if (c.stages < 1) throw UsageError("--stages " + std::to_string(c.stages) + ": run at least one stage");
  if (c.batch_size < 1 || c.seq_len < 1) throw UsageError("--batch-size and --seq-len must be positive");
  if (c.reps < 1) throw UsageError("--reps must be at least 1");
  if (c.link_gbs <= 0) throw UsageError("--link-gbs must be positive");
  for (int m : c.microbatches) {
    if (c.batch_size % m != 0)
      throw UsageError("--microbatches: " + std::to_string(m) + " does not divide --batch-size " +
                       std::to_string(c.batch_size) + "; drop it or change the batch");
  }
  return true;
}

int run(const PlanConfig& c) {
  auto config = gpt2p::model::preset(c.preset);
  if (c.n_layer > 0) config.n_layer = c.n_layer;
  if (c.n_embd > 0) config.n_embd = c.n_embd;
  if (c.n_head > 0) config.n_head = c.n_head;
  config.vocab_size = c.vocab_size;
  config.n_ctx = std::max(config.n_ctx, c.seq_len);
  config.validate();
  const torch::Device device = c.device == "cuda" ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  gpt2p::compat::set_strict_fp32(c.precision == "fp32");
  const bool bf16 = c.precision == "bf16";
  const int L = static_cast<int>(config.n_layer);

  std::printf("# pp_plan: %s, %d stage(s), batch %lld x %lld, %s on %s\n",
              gpt2p::model::describe(config).c_str(), c.stages,
              static_cast<long long>(c.batch_size), static_cast<long long>(c.seq_len),
              c.precision.c_str(), device.is_cuda() ? gpt2p::compat::device_name(device).c_str() : "cpu");
  std::printf("# layer times, ms per micro-batch (forward + backward)\n");
  std::printf("# %6s %10s %10s %10s %11s\n", "rows", "embedding", "block", "head", "head/block");
  std::vector<int> counts = c.microbatches;
  if (std::find(counts.begin(), counts.end(), 1) == counts.end()) counts.insert(counts.begin(), 1);
  std::map<int, std::vector<double>> costs;  // M -> per-layer costs of one micro-batch
  for (int m : counts) {
    const auto t = pl::measure_layer_times(config, c.batch_size / m, c.seq_len, bf16, device, 2, c.reps, 3);
    costs[m] = pl::layer_costs_from_times(t, L);
    std::printf("# %6lld %10.3f %10.3f %10.3f %11.2f\n", static_cast<long long>(c.batch_size / m),
                1e3 * t.embedding, 1e3 * t.block, 1e3 * t.head, t.head / t.block);
  }

  // The split each --partition gives: uniform, FLOP-balanced, and balanced by the times measured at
  // the micro-batch size (what --partition measured computes for that M).
  const auto flops = pl::layer_costs_flops(L, static_cast<int>(config.n_embd), static_cast<int>(config.n_head),
                                           static_cast<int>(c.seq_len), static_cast<int>(config.padded_vocab_size()));
  const double act_bytes_per_row = static_cast<double>(c.seq_len * config.n_embd) * 4.0;  // fp32 activations
  nlohmann::json rows = nlohmann::json::array();
  std::printf("%-9s %-12s %-8s %4s %5s %10s %8s %7s %7s\n", "partition", "split", "schedule", "M",
              "rows", "step_ms", "speedup", "ideal", "idle");
  for (const std::string partition : {"uniform", "balanced", "measured"}) {
    for (int m : c.microbatches) {
      if (partition == "uniform" && c.stages > L) continue;
      const pl::Partition split = partition == "uniform"    ? pl::partition_uniform(L, c.stages)
                                  : partition == "balanced" ? pl::partition_balanced(flops, c.stages)
                                                            : pl::partition_balanced(costs[m], c.stages);
      // model_parallel on the same split: the whole batch as one micro-batch.
      const double mp = pl::predict_step(pl::ScheduleKind::kGPipe, 1, split, costs[1],
                                         act_bytes_per_row * c.batch_size / (c.link_gbs * 1e9)).step;
      const double comm = act_bytes_per_row * (c.batch_size / m) / (c.link_gbs * 1e9);
      for (auto kind : {pl::ScheduleKind::kGPipe, pl::ScheduleKind::kOneFOneB}) {
        if (m == 1 && kind == pl::ScheduleKind::kOneFOneB) continue;  // the same as GPipe
        const auto p = pl::predict_step(kind, m, split, costs[m], comm);
        const double ideal = c.stages * static_cast<double>(m) / (m + c.stages - 1);
        std::printf("%-9s %-12s %-8s %4d %5lld %10.3f %7.2fx %6.2fx %6.1f%%\n", partition.c_str(),
                    pl::to_string(split).c_str(), m == 1 ? "mp" : pl::to_string(kind).c_str(), m,
                    static_cast<long long>(c.batch_size / m), 1e3 * p.step, mp / p.step, ideal,
                    100.0 * p.bubble);
        rows.push_back({{"partition", partition}, {"split", pl::to_string(split)},
                        {"schedule", m == 1 ? "model_parallel" : pl::to_string(kind)},
                        {"microbatches", m}, {"step_s", p.step}, {"speedup_vs_model_parallel", mp / p.step},
                        {"ideal_speedup", ideal}, {"idle_fraction", p.bubble}, {"stage_busy_s", p.stage_busy}});
      }
    }
  }
  if (!c.json_out.empty()) {
    nlohmann::json layer_costs = nlohmann::json::object();
    for (const auto& [m, v] : costs) layer_costs[std::to_string(c.batch_size / m)] = v;
    nlohmann::json doc{{"program", "pp_plan"}, {"model", gpt2p::model::describe(config)},
                       {"stages", c.stages}, {"batch_size", c.batch_size}, {"seq_len", c.seq_len},
                       {"precision", c.precision}, {"device", device.is_cuda() ? gpt2p::compat::device_name(device) : "cpu"},
                       {"link_gbs", c.link_gbs}, {"layer_costs_s_by_rows", layer_costs}, {"predictions", rows}};
    gpt2p::write_text_atomically(c.json_out, doc.dump(2) + "\n");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return gpt2p::cli::run_guarded("pp_plan", argc, argv, [](const gpt2p::Topology&, int argc, char** argv) {
    PlanConfig c;
    if (!parse_flags(argc, argv, c)) return 0;
    return run(c);
  });
}
