// The three tokens we add to GPT-2's 50257-token vocabulary, in this order, as HW5 does:
//   <eos_de> = 50257  ends the German source
//   <eos_en> = 50258  ends the English target
//   <pad>    = 50259  fills a row up to the fixed length (never a label that counts: mask 0)
#pragma once

#include <cstdint>

#include "gpt2p/core/error.h"

namespace gpt2p::data {

inline constexpr const char* kEosDe = "<eos_de>";
inline constexpr const char* kEosEn = "<eos_en>";
inline constexpr const char* kPad = "<pad>";

struct SpecialTokens {
  int32_t eos_de = 50257;
  int32_t eos_en = 50258;
  int32_t pad = 50259;
};

// Adds <eos_de>, <eos_en>, <pad> (in that order) to `tokenizer` (a BpeTokenizer, or anything with
// `int32_t add_special_token(const std::string&)`) and checks that they got the ids of `expected`,
// so a model, a dataset file and a tokenizer can never disagree silently.
template <class Tokenizer>
SpecialTokens register_special_tokens(Tokenizer& tokenizer, const SpecialTokens& expected = {}) {
  const struct {
    const char* text;
    int32_t want;
  } order[] = {{kEosDe, expected.eos_de}, {kEosEn, expected.eos_en}, {kPad, expected.pad}};
  for (const auto& t : order) {
    const int32_t got = tokenizer.add_special_token(t.text);
    GPT2P_CHECK(
        got == t.want,
        "special token " << t.text << " got id " << got << " but " << t.want << " was expected",
        "register the special tokens on a fresh GPT-2 tokenizer (base vocab 50257), "
        "once, in the order <eos_de>, <eos_en>, <pad>");
  }
  return expected;
}

}  // namespace gpt2p::data
