// GPT-2's reversible map between bytes and printable Unicode characters (bytes_to_unicode() in
// OpenAI's encoder.py). BPE tokens in encoder.json / vocab.bpe are spelled in these characters:
// a space is "Ġ" (U+0120), a newline "Ċ" (U+010A). Printable Latin-1 bytes map to themselves;
// the other 68 bytes map, in byte order, to U+0100, U+0101, ...
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace gpt2p::data {

// The UTF-8 spelling of the character that stands for each byte.
const std::array<std::string, 256>& byte_to_unicode();

// The byte a code point stands for, or -1 when the code point is not one of the 256.
int unicode_to_byte(char32_t code_point);

// Raw bytes -> token spelling ("hi there" -> "hiĠthere").
std::string bytes_to_token(std::string_view bytes);

// Token spelling -> raw bytes. Throws gpt2p::Error naming the character when the spelling holds a
// character outside the map or is not valid UTF-8.
std::string token_to_bytes(std::string_view token);

// Python's bytes.decode("utf-8", errors="replace"): every maximal ill-formed subsequence becomes
// U+FFFD, as Hugging Face's GPT2Tokenizer decode does.
std::string utf8_replace_invalid(std::string_view bytes);

}  // namespace gpt2p::data
