#include "gpt2p/model/config.h"

#include <iomanip>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "gpt2p/core/error.h"

namespace gpt2p::model {

int64_t GPT2Config::padded_vocab_size() const {
  return (vocab_size + kVocabPadMultiple - 1) / kVocabPadMultiple * kVocabPadMultiple;
}

int64_t GPT2Config::layer_parameters(int64_t layer) const {
  const int64_t c = n_embd;
  if (layer == 0) return padded_vocab_size() * c + n_ctx * c;
  if (layer == n_layer + 1) return 2 * c;
  // ln_1, ln_2 (2c each), c_attn (3c*c + 3c), attn.c_proj (c*c + c), c_fc (4c*c + 4c), mlp.c_proj.
  return 4 * c + (3 * c * c + 3 * c) + (c * c + c) + (4 * c * c + 4 * c) + (4 * c * c + c);
}

int64_t GPT2Config::range_parameters(int64_t begin, int64_t end, int64_t vocab_rows) const {
  int64_t total = 0;
  for (int64_t l = begin; l < end; ++l) total += layer_parameters(l);
  if (begin == 0 && end > 0) total -= (padded_vocab_size() - vocab_rows) * n_embd;
  return total;
}

int64_t GPT2Config::num_parameters() const {
  int64_t total = 0;
  for (int64_t l = 0; l < num_stage_layers(); ++l) total += layer_parameters(l);
  return total;
}

namespace {
// Far beyond any GPT-2 (gpt2-xl: 48 layers, 1600 wide), small enough that every parameter count
// fits 64 bits: 12 * 65536^2 * 4096 layers + 2^24 * 65536 < 2^62.
constexpr int64_t kMaxLayers = 4096;
constexpr int64_t kMaxWidth = 65536;
constexpr int64_t kMaxContext = int64_t{1} << 24;
constexpr int64_t kMaxVocab = int64_t{1} << 24;

void check_bound(const char* field, int64_t value, int64_t max) {
  GPT2P_CHECK(value <= max, "GPT-2 config: " << field << " = " << value << " exceeds " << max,
              "the config is damaged or not a GPT-2 config; use the one that came with the "
              "weights");
}
}  // namespace

void GPT2Config::validate() const {
  check_bound("n_layer", n_layer, kMaxLayers);
  check_bound("n_embd", n_embd, kMaxWidth);
  check_bound("n_head", n_head, kMaxWidth);
  check_bound("n_ctx", n_ctx, kMaxContext);
  check_bound("vocab_size", vocab_size, kMaxVocab);
  GPT2P_CHECK(n_layer >= 1, "GPT-2 config: n_layer = " << n_layer << " must be >= 1",
              "use at least one transformer block");
  GPT2P_CHECK(n_head >= 1, "GPT-2 config: n_head = " << n_head << " must be >= 1",
              "use at least one attention head");
  GPT2P_CHECK(
      n_embd >= 1 && n_embd % n_head == 0,
      "GPT-2 config: n_embd = " << n_embd << " is not a positive multiple of n_head = " << n_head,
      "pick n_embd divisible by n_head (e.g. 768 with 12 heads)");
  GPT2P_CHECK(n_ctx >= 1, "GPT-2 config: n_ctx = " << n_ctx << " must be >= 1",
              "set the block size to the longest sequence you train on");
  GPT2P_CHECK(vocab_size >= 1, "GPT-2 config: vocab_size = " << vocab_size << " must be >= 1",
              "use " << kDefaultVocab << " (GPT-2's 50257 tokens + our 3 specials)");
  GPT2P_CHECK(dropout >= 0.0 && dropout < 1.0,
              "GPT-2 config: dropout = " << dropout << " is outside [0, 1)",
              "use a probability such as 0.1, or 0 to disable dropout");
  GPT2P_CHECK(layer_norm_eps > 0.0,
              "GPT-2 config: layer_norm_eps = " << layer_norm_eps << " must be > 0", "use 1e-5");
}

void check_config_fits_weights(const GPT2Config& c, int64_t begin, int64_t end, int64_t vocab_rows,
                               uint64_t data_bytes, const std::string& config_source,
                               const std::string& weights_path) {
  const int64_t values = c.range_parameters(begin, end, vocab_rows);
  GPT2P_CHECK(static_cast<uint64_t>(values) <= data_bytes / 2,
              config_source << " describes " << values << " parameters (" << describe(c)
                            << ", layers [" << begin << ", " << end << ")), but " << weights_path
                            << " holds only " << data_bytes << " bytes of weights",
              "the config does not belong to these weights: use the config they were saved "
              "with");
}

bool GPT2Config::operator==(const GPT2Config& o) const {
  return n_layer == o.n_layer && n_head == o.n_head && n_embd == o.n_embd && n_ctx == o.n_ctx &&
         vocab_size == o.vocab_size && dropout == o.dropout && layer_norm_eps == o.layer_norm_eps;
}

namespace {
GPT2Config make(int64_t layers, int64_t heads, int64_t embd, int64_t ctx) {
  GPT2Config c;
  c.n_layer = layers;
  c.n_head = heads;
  c.n_embd = embd;
  c.n_ctx = ctx;
  return c;
}

const std::vector<std::pair<std::string, GPT2Config>>& presets() {
  static const std::vector<std::pair<std::string, GPT2Config>> table = {
      {"tiny", make(2, 2, 64, 128)},
      {"gpt2", make(12, 12, 768, 1024)},
      {"gpt2-medium", make(24, 16, 1024, 1024)},
      {"gpt2-large", make(36, 20, 1280, 1024)},
      {"gpt2-xl", make(48, 25, 1600, 1024)},
  };
  return table;
}
}  // namespace

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const auto& [name, cfg] : presets()) names.push_back(name);
  return names;
}

GPT2Config preset(const std::string& name) {
  std::string valid;
  for (const auto& [n, cfg] : presets()) {
    if (n == name) return cfg;
    valid += (valid.empty() ? "" : ", ") + n;
  }
  GPT2P_FAIL("unknown GPT-2 model preset '" << name << "'", "use one of: " << valid);
}

nlohmann::json to_json(const GPT2Config& c) {
  return {{"n_layer", c.n_layer},
          {"n_head", c.n_head},
          {"n_embd", c.n_embd},
          {"n_ctx", c.n_ctx},
          {"vocab_size", c.vocab_size},
          {"dropout", c.dropout},
          {"layer_norm_eps", c.layer_norm_eps}};
}

GPT2Config config_from_json(const nlohmann::json& j) {
  GPT2P_CHECK(j.is_object(), "GPT-2 config JSON is not an object: " << j.dump(),
              "pass an object such as {\"n_layer\": 12, \"n_head\": 12, ...}");
  GPT2Config c;
  const std::map<std::string, int64_t*> ints = {{"n_layer", &c.n_layer},
                                                {"n_head", &c.n_head},
                                                {"n_embd", &c.n_embd},
                                                {"n_ctx", &c.n_ctx},
                                                {"vocab_size", &c.vocab_size}};
  const std::map<std::string, double*> reals = {{"dropout", &c.dropout},
                                                {"layer_norm_eps", &c.layer_norm_eps}};
  for (const auto& [key, value] : j.items()) {
    if (auto it = ints.find(key); it != ints.end()) {
      GPT2P_CHECK(value.is_number_integer(),
                  "GPT-2 config field '" << key << "' = " << value.dump() << " is not an integer",
                  "write it as a whole number");
      *it->second = value.get<int64_t>();
    } else if (auto rt = reals.find(key); rt != reals.end()) {
      GPT2P_CHECK(value.is_number(),
                  "GPT-2 config field '" << key << "' = " << value.dump() << " is not a number",
                  "write it as a number");
      *rt->second = value.get<double>();
    } else {
      GPT2P_FAIL("unknown GPT-2 config field '" << key << "'",
                 "valid fields: n_layer, n_head, n_embd, n_ctx, vocab_size, dropout, "
                 "layer_norm_eps");
    }
  }
  c.validate();
  return c;
}

std::string describe(const GPT2Config& c) {
  std::ostringstream s;
  s << c.n_layer << " layers, " << c.n_head << " heads, " << c.n_embd << " wide, ctx " << c.n_ctx
    << ", vocab " << c.vocab_size << " (" << c.padded_vocab_size() << " padded), " << std::fixed
    << std::setprecision(1) << static_cast<double>(c.num_parameters()) / 1e6 << "M params";
  return s.str();
}

}  // namespace gpt2p::model
