#include "gpt2p/data/byte_unicode.h"

#include <vector>

#include "gpt2p/core/error.h"

namespace gpt2p::data {
namespace {

std::string utf8_encode(char32_t cp) {
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return out;
}

bool printable_latin1(int b) {
  return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

// code point of each byte, and back (code points of the map are all below 0x144)
struct Tables {
  std::array<std::string, 256> spelling;
  std::vector<int> byte_of;  // indexed by code point, -1 when unmapped
  Tables() : byte_of(0x200, -1) {
    int next = 0;
    for (int b = 0; b < 256; ++b) {
      const char32_t cp = printable_latin1(b) ? static_cast<char32_t>(b) : 0x100 + next++;
      spelling[b] = utf8_encode(cp);
      byte_of[cp] = b;
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

// The length of the well-formed UTF-8 prefix starting at bytes[i] (Unicode table 3-7), and
// whether it is a complete character. An invalid lead byte gives {0, false}.
struct Step {
  size_t valid = 0;
  bool complete = false;
};

Step utf8_step(std::string_view s, size_t i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) return {1, true};
  size_t need = 0;
  unsigned char lo = 0x80;
  unsigned char hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {0, false};
  }
  size_t k = 1;
  for (; k <= need && i + k < s.size(); ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if (b < lo || b > hi) break;
    lo = 0x80;
    hi = 0xBF;
  }
  return {k, k == need + 1};
}

}  // namespace

const std::array<std::string, 256>& byte_to_unicode() { return tables().spelling; }

int unicode_to_byte(char32_t code_point) {
  const auto& byte_of = tables().byte_of;
  return code_point < byte_of.size() ? byte_of[code_point] : -1;
}

std::string bytes_to_token(std::string_view bytes) {
  const auto& spelling = tables().spelling;
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const char c : bytes) out += spelling[static_cast<unsigned char>(c)];
  return out;
}

std::string token_to_bytes(std::string_view token) {
  std::string out;
  out.reserve(token.size());
  for (size_t i = 0; i < token.size();) {
    const Step step = utf8_step(token, i);
    GPT2P_CHECK(step.complete, "token spelling '" << token << "' is not valid UTF-8 at byte " << i,
                "the vocabulary file must be UTF-8 encoded (GPT-2's encoder.json/vocab.json is)");
    char32_t cp = 0;
    const auto b0 = static_cast<unsigned char>(token[i]);
    if (step.valid == 1) {
      cp = b0;
    } else {
      cp = b0 & (0x7F >> step.valid);
      for (size_t k = 1; k < step.valid; ++k) {
        cp = (cp << 6) | (static_cast<unsigned char>(token[i + k]) & 0x3F);
      }
    }
    const int b = unicode_to_byte(cp);
    GPT2P_CHECK(b >= 0,
                "token spelling '" << token << "' holds U+" << std::hex << static_cast<uint32_t>(cp)
                                   << ", which is not one of GPT-2's 256 byte characters",
                "use a byte-level BPE vocabulary (GPT-2's encoder.json or a Hugging Face "
                "GPT-2 vocab.json)");
    out += static_cast<char>(b);
    i += step.valid;
  }
  return out;
}

std::string utf8_replace_invalid(std::string_view bytes) {
  static const std::string kReplacement = "\xEF\xBF\xBD";
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    const Step step = utf8_step(bytes, i);
    if (step.complete) {
      out.append(bytes.substr(i, step.valid));
      i += step.valid;
    } else {
      out += kReplacement;
      i += step.valid == 0 ? 1 : step.valid;
    }
  }
  return out;
}

}  // namespace gpt2p::data
