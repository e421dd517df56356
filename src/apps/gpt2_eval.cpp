// gpt2_eval: next-token loss and perplexity of a GPT-2 checkpoint (ours or Hugging Face's) on
// token-id sequences (JSON lines) or on a split of a prepared dataset. Prints JSON on stdout.
#include <cmath>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "gpt2p/cli/main_guard.h"
#include "gpt2p/cli/options.h"
#include "gpt2p/compat/device.h"
#include "gpt2p/core/atomic_file.h"
#include "gpt2p/core/error.h"
#include "gpt2p/data/batch.h"
#include "gpt2p/data/bpe_tokenizer.h"
#include "gpt2p/data/dataset_file.h"
#include "gpt2p/data/special_tokens.h"
#include "gpt2p/io/json_input.h"
#include "gpt2p/model/model_dir.h"
#include "gpt2p/parallel/train/options.h"

namespace {

using gpt2p::model::GPT2;

struct EvalOptions {
  std::string checkpoint, ids_jsonl, data, split, dump_logits, vocab_dir;
  gpt2p::parallel::DeviceKind device = gpt2p::parallel::DeviceKind::kCpu;
  gpt2p::model::Precision precision = gpt2p::model::Precision::kFp32;
  int64_t batch_size = 8, max_len = 0, max_examples = 0;
  bool allow_unverified = false;
};

std::vector<std::vector<int64_t>> read_ids_jsonl(const std::string& path, int64_t vocab,
                                                 int64_t n_ctx) {
  std::ifstream in(path);
  GPT2P_CHECK(in.good(), "cannot open --ids-jsonl " << path, "check the path");
  std::vector<std::vector<int64_t>> seqs;
  std::string line;
  for (int64_t line_no = 1; std::getline(in, line); ++line_no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const auto j =
        gpt2p::io::parse_json(line, path + ":" + std::to_string(line_no),
                              "write one JSON object per line with an \"ids\" array of token ids");
    GPT2P_CHECK(j.is_object() && j.contains("ids") && j["ids"].is_array(),
                path << ":" << line_no << ": expected {\"ids\": [...]}, got " << line.substr(0, 80),
                "write one JSON object per line with an \"ids\" array of token ids");
    std::vector<int64_t> ids;
    for (const auto& v : j["ids"]) {
      GPT2P_CHECK(
          v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < vocab,
          path << ":" << line_no << ": id " << v.dump() << " is not in [0, " << vocab << ")",
          "use token ids of the model's vocabulary");
      ids.push_back(v.get<int64_t>());
    }
    GPT2P_CHECK(ids.size() >= 2 && static_cast<int64_t>(ids.size()) <= n_ctx,
                path << ":" << line_no << ": " << ids.size() << " ids; need 2.." << n_ctx,
                "a next-token loss needs >= 2 tokens and at most the model's context");
    seqs.push_back(std::move(ids));
  }
  GPT2P_CHECK(!seqs.empty(), path << " holds no sequences",
              "write at least one {\"ids\": [...]} line");
  return seqs;
}

// Raw little-endian float32 [T, vocab_size], plus "<file>.json" with the shape.
void dump_logits(const std::string& path, const torch::Tensor& logits) {
  const auto cpu = logits.to(torch::kCPU, torch::kFloat32).contiguous();
  gpt2p::write_atomically(path, [&](const std::string& tmp) {
    std::ofstream out(tmp, std::ios::binary);
    out.write(static_cast<const char*>(cpu.data_ptr()),
              static_cast<std::streamsize>(cpu.numel() * sizeof(float)));
    out.close();
    GPT2P_CHECK(!out.fail(), "writing " << tmp << " failed", "check free disk space");
  });
  const nlohmann::json meta = {
      {"shape", cpu.sizes().vec()}, {"dtype", "float32"}, {"byte_order", "little"}};
  gpt2p::write_text_atomically(path + ".json", meta.dump() + "\n");
}

nlohmann::json eval_ids(GPT2& model, const EvalOptions& o, torch::Device device) {
  const auto& cfg = model->config();
  const auto seqs = read_ids_jsonl(o.ids_jsonl, cfg.vocab_size, cfg.n_ctx);
  double total = 0;
  int64_t tokens = 0;
  nlohmann::json per_seq = nlohmann::json::array();
  for (size_t i = 0; i < seqs.size(); ++i) {
    const auto ids = torch::tensor(seqs[i], torch::kLong).unsqueeze(0).to(device);
    const auto logits = model->forward(ids);
    if (i == 0 && !o.dump_logits.empty()) {
      dump_logits(o.dump_logits, logits[0].narrow(1, 0, cfg.vocab_size));
    }
    const double sum = gpt2p::model::lm_loss_all_sum(logits, ids, cfg.vocab_size).item<double>();
    const int64_t n = ids.size(1) - 1;
    per_seq.push_back({{"loss", sum / static_cast<double>(n)}, {"tokens", n}});
    total += sum;
    tokens += n;
  }
  const double loss = total / static_cast<double>(tokens);
  return {
      {"loss", loss}, {"perplexity", std::exp(loss)}, {"tokens", tokens}, {"sequences", per_seq}};
}

// The vocabulary --data is checked against: --vocab-dir, else the one the model's training run
// recorded (while that directory exists); empty when there is none.
std::string vocab_dir_for(const EvalOptions& o, const gpt2p::model::ModelDir& loaded) {
  return !o.vocab_dir.empty() ? o.vocab_dir : gpt2p::model::recorded_vocab_dir(loaded);
}

// The dataset must hold ids of the model's vocabulary, made by the model's tokenizer.
void check_dataset_tokenizer(const gpt2p::data::DatasetFile& file, const EvalOptions& o,
                             const gpt2p::model::ModelDir& loaded) {
  const int64_t model_vocab = loaded.model->config().vocab_size;
  const auto& meta = file.meta();
  GPT2P_CHECK(meta.vocab_size == model_vocab,
              "dataset " << o.data << " was made with tokenizer " << meta.tokenizer_identity
                         << " (vocab " << meta.vocab_size << ") but the model of --checkpoint "
                         << o.checkpoint << " has vocab " << model_vocab,
              "evaluate a model trained with this dataset's tokenizer, or re-create the dataset "
              "with prepare_data --vocab-dir <the model's vocabulary>");
  const std::string dir = vocab_dir_for(o, loaded);
  if (dir.empty()) {
    std::cerr << "gpt2_eval: note: the tokenizer of " << o.data << " (" << meta.tokenizer_identity
              << ") was not checked: pass --vocab-dir with the model's vocabulary to check it\n";
    return;
  }
  auto tokenizer = gpt2p::data::BpeTokenizer::from_dir(dir);
  gpt2p::data::register_special_tokens(tokenizer);
  file.require_tokenizer(tokenizer.identity(), tokenizer.vocab_size());
}

nlohmann::json eval_dataset(const gpt2p::model::ModelDir& loaded, const EvalOptions& o,
                            torch::Device device) {
  GPT2 model = loaded.model;
  const auto& cfg = model->config();
  const auto file = gpt2p::data::DatasetFile::open(o.data);
  check_dataset_tokenizer(file, o, loaded);
  const auto& split = file.split(o.split);
  // No pairs would give a NaN loss and an exit 0.
  GPT2P_CHECK(split.size() > 0, "dataset " << o.data << " has no " << o.split << " pairs",
              "evaluate another --split, or re-create the dataset with prepare_data");
  const int64_t max_len = o.max_len > 0 ? o.max_len : cfg.n_ctx;
  GPT2P_CHECK(max_len <= cfg.n_ctx,
              "--max-len " << max_len << " exceeds the model's n_ctx " << cfg.n_ctx,
              "pass --max-len <= " << cfg.n_ctx);
  const int64_t n = o.max_examples > 0 ? std::min(o.max_examples, split.size()) : split.size();
  double total = 0, tokens = 0;
  for (int64_t start = 0; start < n; start += o.batch_size) {
    std::vector<int64_t> idx;
    for (int64_t i = start; i < std::min(n, start + o.batch_size); ++i) idx.push_back(i);
    const auto b = gpt2p::data::make_batch(split, idx, max_len, file.meta().special);
    const std::vector<int64_t> shape = {b.batch_size, b.seq_len};
    const auto inputs = torch::tensor(b.inputs, torch::kLong).view(shape).to(device);
    const auto labels = torch::tensor(b.labels, torch::kLong).view(shape).to(device);
    const auto mask = torch::tensor(b.mask, torch::kFloat32).view(shape).to(device);
    const double count = mask.sum().item<double>();
    if (count == 0) continue;
    total += model->lm_loss(model->forward(inputs), labels, mask).item<double>() * count;
    tokens += count;
  }
  GPT2P_CHECK(tokens > 0, "split '" << o.split << "' of " << o.data << " has no target tokens",
              "check the dataset (prepare_data) or --max-len");
  const double loss = total / tokens;
  return {{"loss", loss},
          {"perplexity", std::exp(loss)},
          {"tokens", static_cast<int64_t>(tokens)},
          {"examples", n},
          {"split", o.split}};
}

}  // namespace

int main(int argc, char** argv) {
  return gpt2p::cli::run_guarded(
      "gpt2_eval", argc, argv, [](const gpt2p::Topology& topo, int ac, char** av) {
        namespace po = gpt2p::cli::po;
        EvalOptions o;
        po::options_description desc("gpt2_eval options");
        desc.add_options()(
            "checkpoint", po::value(&o.checkpoint)->required(),
            "model directory: a trainer's checkpoint (dp_train's meta.json, or pp_train's "
            "manifest.json: its stages are joined) or a Hugging Face GPT-2 directory "
            "(config.json + model.safetensors)")(
            "ids-jsonl", po::value(&o.ids_jsonl),
            "token-id sequences, one {\"ids\": [...]} per line "
            "(loss as HF's labels=input_ids, pooled over all predicted tokens)")(
            "data", po::value(&o.data),
            "prepared dataset (.h5 from prepare_data); loss over target "
            "tokens only")("split", po::value(&o.split)->default_value("validation"),
                           "--data split: train|validation|test")(
            "batch-size", po::value(&o.batch_size)->default_value(8),
            "--data examples per forward pass")("max-len", po::value(&o.max_len)->default_value(0),
                                                "--data row length in tokens (0 = model n_ctx)")(
            "max-examples", po::value(&o.max_examples)->default_value(0),
            "--data examples to use (0 = all)")(
            "vocab-dir", po::value(&o.vocab_dir),
            "the model's GPT-2 vocabulary (encoder.json + vocab.bpe, or vocab.json + merges.txt): "
            "--data must have been made with it (default: the vocab_dir a gpt2p checkpoint's "
            "training run recorded, when it exists; without one the check is skipped with a "
            "note)")("dump-logits", po::value(&o.dump_logits),
                     "write the first sequence's logits [T, vocab_size] "
                     "as raw little-endian float32 to this file (+ FILE.json with the shape)")(
            "device", gpt2p::cli::named_value(o.device, "device"),
            "cpu | cuda (cuda: GPU local_rank; auto: cuda where there is one)")(
            "precision", gpt2p::cli::named_value(o.precision, "precision"),
            "fp32 only (true fp32: no TF32)")(
            "allow-unverified-checkpoint", po::bool_switch(&o.allow_unverified),
            "load a gpt2p checkpoint whose meta.json lists no checksums (refused without it), "
            "with a warning");
        po::variables_map vm;
        if (!gpt2p::cli::parse_or_help("gpt2_eval", "Loss and perplexity of a GPT-2 checkpoint.",
                                       desc, ac, av, vm)) {
          return 0;
        }
        if (o.ids_jsonl.empty() == o.data.empty()) {
          throw gpt2p::cli::UsageError("pass exactly one of --ids-jsonl and --data");
        }
        using gpt2p::parallel::DeviceKind;
        if (o.device == DeviceKind::kAuto) {
          o.device = torch::cuda::is_available() ? DeviceKind::kCuda : DeviceKind::kCpu;
        }
        if (o.precision != gpt2p::model::Precision::kFp32) {
          throw gpt2p::cli::UsageError("--precision " + gpt2p::name_string(o.precision) +
                                       " is not supported: use fp32");
        }
        if (o.batch_size < 1) throw gpt2p::cli::UsageError("--batch-size must be >= 1");
        if (o.max_len < 0) {
          throw gpt2p::cli::UsageError("--max-len " + std::to_string(o.max_len) +
                                       " is out of range: use a length >= 1, or 0 for the "
                                       "model's n_ctx");
        }
        if (o.max_examples < 0) {
          throw gpt2p::cli::UsageError("--max-examples " + std::to_string(o.max_examples) +
                                       " is out of range: use a count >= 1, or 0 for all");
        }
        torch::Device device(torch::kCPU);
        if (o.device == DeviceKind::kCuda) {
          GPT2P_CHECK(torch::cuda::is_available(), "--device cuda but no CUDA device is available",
                      "run on a GPU machine with a CUDA build, or pass --device cpu");
          device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(topo.local_rank));
        }
        gpt2p::compat::set_strict_fp32(true);
        torch::NoGradGuard no_grad;
        const auto loaded = gpt2p::model::load_model_dir(o.checkpoint, {o.allow_unverified});
        GPT2 model = loaded.model;
        model->to(device);
        model->eval();
        nlohmann::json out =
            o.data.empty() ? eval_ids(model, o, device) : eval_dataset(loaded, o, device);
        out["checkpoint"] = o.checkpoint;
        out["device"] = gpt2p::name_string(o.device);
        if (topo.rank == 0) std::cout << out.dump(2) << std::endl;
        return 0;
      });
}
