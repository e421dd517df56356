#include "gpt2p/data/ding.h"

#include <pcre2.h>

#include <fstream>
#include <memory>

#include "gpt2p/core/error.h"

namespace gpt2p::data {
namespace {

// One compiled PCRE2 pattern (UTF mode) used for global substitution.
class Regex {
 public:
  explicit Regex(const char* pattern) {
    int err = 0;
    PCRE2_SIZE offset = 0;
    code_.reset(pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED,
                              PCRE2_UTF | PCRE2_NO_UTF_CHECK, &err, &offset, nullptr));
    if (!code_) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      GPT2P_FAIL("cannot compile regex '" << pattern << "' at offset " << offset << ": "
                                          << reinterpret_cast<const char*>(msg),
                 "this is a bug in src/data/ding.cpp");
    }
    pcre2_jit_compile(code_.get(), PCRE2_JIT_COMPLETE);  // optional speed-up; falls back if absent
  }

  // Replaces every match with "" (or a single space when `with_space`). Returns true if any.
  bool erase_all(std::string& text, bool with_space) const {
    const char* repl = with_space ? " " : "";
    std::string out(text.size() + 16, '\0');
    PCRE2_SIZE out_len = out.size();
    const int rc =
        pcre2_substitute(code_.get(), reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), 0,
                         PCRE2_SUBSTITUTE_GLOBAL | PCRE2_SUBSTITUTE_OVERFLOW_LENGTH, nullptr,
                         nullptr, reinterpret_cast<PCRE2_SPTR>(repl), PCRE2_ZERO_TERMINATED,
                         reinterpret_cast<PCRE2_UCHAR*>(out.data()), &out_len);
    if (rc == PCRE2_ERROR_NOMEMORY) {  // output grew (only possible with_space): retry
      out.resize(out_len);
      return erase_all_sized(text, repl, out);
    }
    GPT2P_CHECK(rc >= 0, "regex substitution failed (PCRE2 code " << rc << ") on: " << text,
                "check that the dictionary file is valid UTF-8");
    if (rc == 0) return false;
    out.resize(out_len);
    text.swap(out);
    return true;
  }

 private:
  bool erase_all_sized(std::string& text, const char* repl, std::string& out) const {
    PCRE2_SIZE out_len = out.size();
    const int rc = pcre2_substitute(code_.get(), reinterpret_cast<PCRE2_SPTR>(text.data()),
                                    text.size(), 0, PCRE2_SUBSTITUTE_GLOBAL, nullptr, nullptr,
                                    reinterpret_cast<PCRE2_SPTR>(repl), PCRE2_ZERO_TERMINATED,
                                    reinterpret_cast<PCRE2_UCHAR*>(out.data()), &out_len);
    GPT2P_CHECK(rc >= 0, "regex substitution failed (PCRE2 code " << rc << ") on: " << text,
                "check that the dictionary file is valid UTF-8");
    out.resize(out_len);
    text.swap(out);
    return rc > 0;
  }

  struct Free {
    void operator()(pcre2_code* c) const { pcre2_code_free(c); }
  };
  std::unique_ptr<pcre2_code, Free> code_;
};

// Innermost bracket groups; applied until nothing changes, which also removes nested ones.
// Lines longer than this are counted as malformed (see parse_ding_line).
constexpr size_t kMaxLineBytes = 16 * 1024;

const Regex& brackets() {
  static const Regex re(R"(\{[^{}]*\}|\[[^\[\]]*\]|\([^()]*\)|<[^<>]*>)");
  return re;
}
// "/Abf./", "/bu.; bsh./": a slash-delimited abbreviation standing alone (not "Ein-/Ausgabe").
const Regex& abbreviations() {
  static const Regex re(R"((?<!\S)/[^\s/][^/]*(?<!\s)/(?![^\s;,|]))");
  return re;
}
// "~Prozesskostenhilfe", "~legal aid": a cross-reference, running to the end of the synonym.
const Regex& cross_refs() {
  static const Regex re(R"((?<!\S)~[^;]*)");
  return re;
}

// Splits on an exact separator string.
std::vector<std::string_view> split(std::string_view text, std::string_view sep) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  for (size_t pos; (pos = text.find(sep, start)) != std::string_view::npos;
       start = pos + sep.size())
    parts.push_back(text.substr(start, pos - start));
  parts.push_back(text.substr(start));
  return parts;
}

std::string first_synonym(const std::string& stripped) {
  const size_t pos = stripped.find(';');
  if (pos == std::string::npos) return stripped;
  return normalize_whitespace(stripped.substr(0, pos));
}

bool ends_sentence(const std::string& s) {
  size_t end = s.size();
  // Allow a closing quote after the punctuation: ASCII " ' or UTF-8 “ ” ‘ ’ « » (2-3 bytes).
  if (end > 0 && (s[end - 1] == '"' || s[end - 1] == '\'')) --end;
  static const char* const closers[] = {"\xE2\x80\x9C", "\xE2\x80\x9D", "\xE2\x80\x98",
                                        "\xE2\x80\x99", "\xC2\xAB",     "\xC2\xBB"};
  for (const char* q : closers) {
    const std::string_view qv(q);
    if (end >= qv.size() && std::string_view(s).substr(end - qv.size(), qv.size()) == qv) {
      end -= qv.size();
      break;
    }
  }
  if (end == 0) return false;
  const char c = s[end - 1];
  return c == '.' || c == '!' || c == '?';
}

// Lowercase first letter: ASCII a-z, or UTF-8 ä ö ü ß (C3 A4, C3 B6, C3 BC, C3 9F) and
// other Latin-1 lowercase letters (C3 9F..C3 BF).
bool starts_lowercase(const std::string& s) {
  if (s.empty()) return false;
  const auto c0 = static_cast<unsigned char>(s[0]);
  if (c0 >= 'a' && c0 <= 'z') return true;
  if (c0 == 0xC3 && s.size() > 1) {
    const auto c1 = static_cast<unsigned char>(s[1]);
    return c1 >= 0x9F && c1 != 0xB7;  // 0xC3 0xB7 is the division sign
  }
  return false;
}

int64_t word_count(const std::string& s) {
  int64_t words = 0;
  bool in_word = false;
  for (const char c : s) {
    const bool space = c == ' ';
    if (!space && !in_word) ++words;
    in_word = !space;
  }
  return words;
}

}  // namespace

std::string strip_annotations(std::string_view text) {
  std::string s(text);
  while (brackets().erase_all(s, true)) {
  }
  abbreviations().erase_all(s, true);
  cross_refs().erase_all(s, true);
  s = normalize_whitespace(s);
  // Removing "(...)" before punctuation leaves "word ." / "word ,": close those gaps.
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == ' ' && i + 1 < s.size() &&
        (s[i + 1] == '.' || s[i + 1] == ',' || s[i + 1] == ';' || s[i + 1] == '!' ||
         s[i + 1] == '?' || s[i + 1] == ':'))
      continue;
    out.push_back(s[i]);
  }
  return out;
}

bool looks_like_sentence(const std::string& de, const std::string& en) {
  return word_count(de) >= 3 && !starts_lowercase(de) && ends_sentence(de) && ends_sentence(en);
}

std::vector<SentencePair> parse_ding_line(std::string_view line, const DingOptions& options,
                                          DingStats& stats) {
  std::vector<SentencePair> out;
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  if (line.empty() || line.front() == '#') {
    ++stats.comment_lines;
    return out;
  }
  const size_t sep = line.find(" :: ");
  // Stripping nested brackets takes one pass per level: a line far longer than any of the
  // dictionary's (under 10 kB) is damage, not an entry, and would take minutes.
  if (sep == std::string_view::npos || line.size() > kMaxLineBytes) {
    ++stats.malformed_lines;
    return out;
  }
  const auto de_alts = split(line.substr(0, sep), " | ");
  const auto en_alts = split(line.substr(sep + 4), " | ");
  if (de_alts.size() != en_alts.size()) {
    ++stats.misaligned_lines;
    return out;
  }
  for (size_t i = 0; i < de_alts.size(); ++i) {
    ++stats.alternatives;
    SentencePair pair{first_synonym(strip_annotations(de_alts[i])),
                      first_synonym(strip_annotations(en_alts[i]))};
    const bool sentence = looks_like_sentence(pair.de, pair.en);
    if (!sentence && !options.include_words) continue;
    if (pair.de.empty() || pair.en.empty()) {
      ++stats.dropped_empty;
      continue;
    }
    if (pair.de.size() > options.max_chars || pair.en.size() > options.max_chars) {
      ++stats.dropped_long;
      continue;
    }
    ++(sentence ? stats.sentences : stats.words);
    out.push_back(std::move(pair));
  }
  return out;
}

std::vector<SentencePair> read_ding(const std::string& path, const DingOptions& options,
                                    DingStats* stats) {
  std::ifstream in(path, std::ios::binary);
  GPT2P_CHECK(in.good(), "cannot open the Ding dictionary " << path,
              "install it (apt-get install trans-de-en) or pass --input with the right path");
  DingStats local;
  DingStats& st = stats != nullptr ? *stats : local;
  std::vector<SentencePair> pairs;
  std::string line;
  while (std::getline(in, line)) {
    ++st.lines;
    for (auto& p : parse_ding_line(line, options, st)) pairs.push_back(std::move(p));
  }
  GPT2P_CHECK(!in.bad(), "reading " << path << " failed after line " << st.lines,
              "check the file is readable");
  pairs = dedupe(std::move(pairs), &st.duplicates);
  st.pairs = static_cast<int64_t>(pairs.size());
  return pairs;
}

}  // namespace gpt2p::data
