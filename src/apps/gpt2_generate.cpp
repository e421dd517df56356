// gpt2_generate: uses a trained model. Translates German sentences to English (the task the
// trainers train: German + <eos_de>, then English up to <eos_en>), or continues a text.
//
//   gpt2_generate --checkpoint runs/dp_train/checkpoint --translate "Guten Morgen!"
//   gpt2_generate --checkpoint DIR --translate - < german.txt > english.txt   (a line for a line)
//   gpt2_generate --checkpoint DIR --prompt "The weather" --temperature 0.8 --top-k 40 --seed 3
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gpt2p/cli/main_guard.h"
#include "gpt2p/cli/options.h"
#include "gpt2p/compat/device.h"
#include "gpt2p/core/error.h"
#include "gpt2p/data/bpe_tokenizer.h"
#include "gpt2p/data/special_tokens.h"
#include "gpt2p/model/generate.h"
#include "gpt2p/model/model_dir.h"
#include "gpt2p/parallel/train/evaluator.h"
#include "gpt2p/parallel/train/options.h"

namespace {

namespace po = gpt2p::cli::po;
using gpt2p::cli::UsageError;

struct GenerateOptions {
  std::string checkpoint, translate, prompt, vocab_dir;
  gpt2p::parallel::DeviceKind device = gpt2p::parallel::DeviceKind::kCpu;
  int64_t max_new = 0, max_len = 0, top_k = 0, seed = 1;
  double temperature = 0;
  bool json = false, allow_unverified = false;
};

const char* reason_name(gpt2p::model::StopReason r) {
  switch (r) {
    case gpt2p::model::StopReason::kStopToken: return "end";
    case gpt2p::model::StopReason::kMaxNew: return "max-new-tokens";
    case gpt2p::model::StopReason::kMaxLength: return "max-len";
  }
  return "?";
}

// The model and what decoding needs around it.
struct Decoder {
  gpt2p::model::ModelDir loaded;
  torch::Device device{torch::kCPU};
  gpt2p::data::BpeTokenizer tokenizer;
  gpt2p::data::SpecialTokens special;
  gpt2p::model::Decoding decoding;

  torch::Tensor logits(const torch::Tensor& ids) const {
    gpt2p::model::GPT2 model = loaded.model;  // the holder shares the module
    return model->forward(ids);
  }
};

std::string vocab_dir_for(const GenerateOptions& o, const gpt2p::model::ModelDir& loaded) {
  if (!o.vocab_dir.empty()) return o.vocab_dir;
  const std::string recorded = gpt2p::model::recorded_vocab_dir(loaded);
  return !recorded.empty() ? recorded : gpt2p::data::default_vocab_dir();
}

// The sequence limit: --max-len, else the training run's --seq-len (positions past it were never
// trained), else the model's context.
int64_t max_length_for(const GenerateOptions& o, const gpt2p::model::ModelDir& loaded) {
  const int64_t n_ctx = loaded.model->config().n_ctx;
  if (o.max_len > 0) {
    if (o.max_len > n_ctx) {
      throw UsageError("--max-len " + std::to_string(o.max_len) + " exceeds the model's n_ctx " +
                       std::to_string(n_ctx) + ": pass --max-len <= " + std::to_string(n_ctx));
    }
    return o.max_len;
  }
  const auto& c = loaded.run_config;
  if (c.is_object() && c.contains("seq_len") && c["seq_len"].is_number_integer()) {
    const auto seq_len = c["seq_len"].get<int64_t>();
    if (seq_len >= 2 && seq_len <= n_ctx) return seq_len;
  }
  return n_ctx;
}

// Token ids the model has no embedding for would index past its table.
void check_in_vocab(const std::vector<int32_t>& ids, const Decoder& s, const std::string& where) {
  const auto vocab = s.loaded.model->config().vocab_size;
  for (const int32_t id : ids) {
    GPT2P_CHECK(id < vocab,
                where << ": token " << id << " is outside the model's vocabulary of " << vocab,
                "pass --vocab-dir with the vocabulary the model was trained with");
  }
}

void print_json(const nlohmann::ordered_json& j) { std::cout << j.dump() << "\n" << std::flush; }

// One German sentence, `where` naming it in messages.
void translate_one(const Decoder& s, const GenerateOptions& o, const std::string& german,
                   const std::string& where) {
  if (german.find_first_not_of(" \t\r") == std::string::npos) {  // a blank line stays blank
    if (o.json)
      print_json({{"source", german}, {"translation", ""}, {"tokens", 0}});
    else
      std::cout << "\n" << std::flush;
    return;
  }
  std::vector<int32_t> source;
  try {
    source = s.tokenizer.encode(german);
  } catch (const gpt2p::Error& e) {
    GPT2P_FAIL(where << ": " << e.what_happened(), "pass UTF-8 text");
  }
  check_in_vocab(source, s, where);
  auto decoding = s.decoding;
  if (o.max_new == 0) decoding.max_new = 2 * static_cast<int64_t>(source.size()) + 16;
  const auto logits = [&s](const torch::Tensor& ids) { return s.logits(ids); };
  const auto t =
      gpt2p::parallel::translate_ids(logits, source, decoding, s.special, s.tokenizer, s.device);
  if (t.source_tokens_kept < source.size()) {
    std::cerr << "gpt2_generate: note: " << where << ": " << source.size()
              << " tokens, only the first " << t.source_tokens_kept << " translated (--max-len "
              << decoding.max_length << " keeps half for the source)\n";
  }
  if (o.json) {
    print_json({{"source", german},
                {"translation", t.text},
                {"tokens", t.tokens},
                {"stopped_by", reason_name(t.reason)}});
  } else {
    std::cout << t.text << "\n" << std::flush;
  }
}

void run_translate(const Decoder& s, const GenerateOptions& o) {
  const auto vocab = s.loaded.model->config().vocab_size;
  GPT2P_CHECK(vocab > s.special.eos_en,
              "--checkpoint " << o.checkpoint << " (" << s.loaded.kind << ") has a vocabulary of "
                              << vocab << " tokens, without <eos_de>/<eos_en>: it was not "
                              << "trained to translate",
              "use a checkpoint of dp_train/pp_train (or fine-tune this model with --init-from), "
              "or continue text with --prompt");
  if (o.translate != "-") {
    translate_one(s, o, o.translate, "--translate");
    return;
  }
  if (isatty(STDIN_FILENO) != 0) {
    std::cerr << "gpt2_generate: reading German sentences from the terminal, one per line; end "
                 "with Ctrl-D\n";
  }
  std::string line;
  for (int64_t n = 1; std::getline(std::cin, line); ++n) {
    translate_one(s, o, line, "stdin line " + std::to_string(n));
  }
}

void run_prompt(const Decoder& s, const GenerateOptions& o) {
  std::vector<int32_t> ids;
  try {
    ids = s.tokenizer.encode(o.prompt);
  } catch (const gpt2p::Error& e) {
    GPT2P_FAIL("--prompt: " << e.what_happened(), "pass UTF-8 text");
  }
  if (ids.empty()) throw UsageError("--prompt is empty: give some text to continue");
  check_in_vocab(ids, s, "--prompt");
  const std::vector<int64_t> prompt(ids.begin(), ids.end());
  auto decoding = s.decoding;
  if (o.max_new == 0) decoding.max_new = 100;
  const auto logits = [&s](const torch::Tensor& t) { return s.logits(t); };
  const auto out = gpt2p::model::generate(logits, prompt, decoding, s.device);
  const std::string continuation = s.tokenizer.decode_without_added(out.tokens);
  if (o.json) {
    print_json({{"prompt", o.prompt},
                {"continuation", continuation},
                {"tokens", static_cast<int64_t>(out.tokens.size())},
                {"stopped_by", reason_name(out.reason)}});
  } else {
    std::cout << o.prompt << continuation << "\n" << std::flush;
  }
}

void add_options(po::options_description& desc, GenerateOptions& o) {
  desc.add_options()("checkpoint", po::value(&o.checkpoint)->required(),
                     "the model: a trainer's checkpoint (<out>/checkpoint; a pipeline's stages are "
                     "joined) or a Hugging Face GPT-2 directory (config.json + model.safetensors)")(
      "translate", po::value(&o.translate),
      "German text to translate to English; '-' reads stdin and writes one line per line")(
      "prompt", po::value(&o.prompt), "text to continue (any model, pretrained GPT-2 included)")(
      "max-new-tokens", po::value(&o.max_new)->default_value(0),
      "most tokens to generate (0: twice the German's tokens + 16 for --translate, 100 for "
      "--prompt)")("max-len", po::value(&o.max_len)->default_value(0),
                   "most tokens in the sequence, input included (0: the training run's --seq-len, "
                   "else the model's n_ctx)")(
      "temperature", po::value(&o.temperature),
      "0: greedy (the most likely token); > 0: sample (default 0 for --translate, 0.8 for "
      "--prompt)")("top-k", po::value(&o.top_k),
                   "sample from the k most likely tokens only (0: all; default 0 for --translate, "
                   "200 for --prompt)")("seed", po::value(&o.seed)->default_value(1),
                                        "sampling: the same seed gives the same text")(
      "json", po::bool_switch(&o.json),
      "one JSON object per line: source/prompt, text, tokens, what stopped it")(
      "vocab-dir", po::value(&o.vocab_dir),
      "GPT-2 vocabulary (default: the training run's, else $GPT2P_VOCAB_DIR or "
      ".cache/gpt2-vocab)")("device", gpt2p::cli::named_value(o.device, "device"),
                            "cpu | cuda | auto (cuda where there is one)")(
      "allow-unverified-checkpoint", po::bool_switch(&o.allow_unverified),
      "load a checkpoint whose meta.json lists no checksums (refused without it), with a warning");
}

void check_usage(GenerateOptions& o, const po::variables_map& vm) {
  if (o.translate.empty() == o.prompt.empty()) {
    throw UsageError("pass exactly one of --translate TEXT (or '-' for stdin) and --prompt TEXT");
  }
  const bool translating = !o.translate.empty();
  if (vm.count("temperature") == 0) o.temperature = translating ? 0.0 : 0.8;
  if (vm.count("top-k") == 0) o.top_k = translating ? 0 : 200;
  if (!std::isfinite(o.temperature) || o.temperature < 0 || o.temperature > 100) {
    throw UsageError("--temperature " + gpt2p::cli::config_value(o.temperature) +
                     " is out of range: use 0 (greedy) or a value in (0, 100]");
  }
  if (o.top_k < 0) throw UsageError("--top-k must be >= 0 (0: the whole vocabulary)");
  if (o.max_new < 0) throw UsageError("--max-new-tokens must be >= 0 (0: the default)");
  if (o.max_len < 0) throw UsageError("--max-len must be >= 0 (0: the default)");
  if (o.seed < 0) throw UsageError("--seed must be >= 0");
  using gpt2p::parallel::DeviceKind;
  if (o.device == DeviceKind::kAuto) {
    o.device = torch::cuda::is_available() ? DeviceKind::kCuda : DeviceKind::kCpu;
  }
}

}  // namespace

int main(int argc, char** argv) {
  return gpt2p::cli::run_guarded(
      "gpt2_generate", argc, argv, [](const gpt2p::Topology& topo, int ac, char** av) {
        GenerateOptions o;
        po::options_description desc("gpt2_generate options");
        add_options(desc, o);
        po::variables_map vm;
        if (!gpt2p::cli::parse_or_help("gpt2_generate",
                                       "Translate German with a trained model, or continue a text.",
                                       desc, ac, av, vm)) {
          return 0;
        }
        check_usage(o, vm);
        torch::Device device(torch::kCPU);
        if (o.device == gpt2p::parallel::DeviceKind::kCuda) {
          GPT2P_CHECK(torch::cuda::is_available(), "--device cuda but no CUDA device is available",
                      "run on a GPU machine with a CUDA build, or pass --device cpu");
          device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(topo.local_rank));
        }
        gpt2p::compat::set_strict_fp32(true);
        torch::NoGradGuard no_grad;
        auto loaded = gpt2p::model::load_model_dir(o.checkpoint, {o.allow_unverified});
        loaded.model->to(device);
        loaded.model->eval();
        auto tokenizer = gpt2p::data::BpeTokenizer::from_dir(vocab_dir_for(o, loaded));
        const auto special = gpt2p::data::register_special_tokens(tokenizer);
        gpt2p::model::Decoding decoding;
        decoding.vocab_size = loaded.model->config().vocab_size;
        decoding.max_length = max_length_for(o, loaded);
        decoding.max_new = o.max_new;
        decoding.temperature = o.temperature;
        decoding.top_k = o.top_k;
        decoding.seed = static_cast<uint64_t>(o.seed);
        const Decoder decoder{std::move(loaded), device, std::move(tokenizer), special, decoding};
        if (topo.rank != 0) return 0;
        if (!o.translate.empty())
          run_translate(decoder, o);
        else
          run_prompt(decoder, o);
        return 0;
      });
}
