// GPT-2 hyper-parameters: a plain value, validated, with the published presets (torch-free).
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace gpt2p::model {

// GPT-2's BPE vocabulary, and the special tokens our tokenizer adds after it.
inline constexpr int64_t kGpt2BaseVocab = 50257;
inline constexpr int64_t kNumSpecialTokens = 3;
inline constexpr int64_t kDefaultVocab = kGpt2BaseVocab + kNumSpecialTokens;
// The embedding table is padded to a multiple of this many rows (faster matmuls on GPUs).
inline constexpr int64_t kVocabPadMultiple = 64;

struct GPT2Config {
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_embd = 768;
  int64_t n_ctx = 1024;                // block size: the longest sequence, in tokens
  int64_t vocab_size = kDefaultVocab;  // real tokens; logits beyond it are padding
  double dropout = 0.1;                // attention, residual and embedding dropout
  double layer_norm_eps = 1e-5;

  // vocab_size rounded up to a multiple of kVocabPadMultiple: rows of wte, width of the logits.
  int64_t padded_vocab_size() const;
  int64_t head_dim() const { return n_embd / n_head; }
  // Layers as the pipeline sees them: embedding, n_layer blocks, final norm + head.
  int64_t num_stage_layers() const { return n_layer + 2; }
  // Trainable parameters (wte counted once, at its padded size).
  int64_t num_parameters() const;
  // Parameters of one stage layer (0 = embedding, 1..n_layer = block, n_layer+1 = ln_f, head tied).
  int64_t layer_parameters(int64_t layer) const;

  // Parameters of stage layers [begin, end), with wte's rows counted as `vocab_rows` (the padded
  // vocabulary in our checkpoints; fewer in a Hugging Face file, whose extra rows import fills).
  int64_t range_parameters(int64_t begin, int64_t end, int64_t vocab_rows) const;

  // Throws gpt2p::Error naming the bad field and value unless every field is usable. Sizes are
  // bounded (e.g. n_embd <= 65536) so that no parameter count overflows.
  void validate() const;

  bool operator==(const GPT2Config& o) const;
  bool operator!=(const GPT2Config& o) const { return !(*this == o); }
};

// "tiny" (2 layers, 2 heads, 64 wide, ctx 128, full vocab: fast on a CPU), "gpt2" (124M),
// "gpt2-medium", "gpt2-large", "gpt2-xl". Unknown names throw an error listing these.
GPT2Config preset(const std::string& name);
std::vector<std::string> preset_names();

// Our own JSON form (field names as in GPT2Config). from_json fills missing fields with defaults,
// rejects unknown ones and validates.
nlohmann::json to_json(const GPT2Config& c);
GPT2Config config_from_json(const nlohmann::json& j);

// A config read from a file (`config_source`) must describe no more weights than the weights file
// beside it (`weights_path`, whose data section is `data_bytes` long) can hold at 2 bytes a value:
// otherwise building the model would allocate what an edited config claims (n_embd: 1e6 asks for
// terabytes). Throws gpt2p::Error naming both files.
void check_config_fits_weights(const GPT2Config& c, int64_t begin, int64_t end, int64_t vocab_rows,
                               uint64_t data_bytes, const std::string& config_source,
                               const std::string& weights_path);

// One line for logs: "12 layers, 12 heads, 768 wide, ctx 1024, vocab 50260 (50304 padded), 124.4M
// params".
std::string describe(const GPT2Config& c);

}  // namespace gpt2p::model
