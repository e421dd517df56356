// The Ding German-English dictionary (/usr/share/trans/de-en) as clean sentence pairs.
//
// Line format: `German :: English`; '#' starts a comment line. Each side holds alternatives
// separated by " | ", aligned (the i-th German alternative translates the i-th English one); a
// line whose sides have different alternative counts is skipped whole. Within an alternative, "; "
// separates synonyms. Annotations are removed: {m} {f} {pl} {vt}, [ugs.] [Br.], (explanations),
// <variant spellings>, /ABBR./ abbreviations and ~cross-references (which run to the end
// of their synonym: "in forma pauperis ~legal aid" -> "in forma pauperis").
//
// Deterministic rule for "this alternative is an example sentence" (decided on the FIRST synonym
// of each side, after stripping annotations and normalising whitespace):
//   - the German side has >= 3 words, does not start with a lowercase letter, and
//   - both sides end with '.', '!' or '?' (a closing quote after it is allowed).
// With `include_words` the first synonym of every other alternative (dictionary entries such as
// "Aalsuppe" -> "eel soup") is kept as well. Pairs with an empty side, or a side longer than
// `max_chars` bytes, are dropped; then exact (de, en) duplicates are removed, keeping file order.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "gpt2p/data/corpus.h"

namespace gpt2p::data {

struct DingOptions {
  bool include_words = false;  // also keep word/phrase entries, not only example sentences
  size_t max_chars = 300;      // drop a pair if either side is longer (bytes)
};

struct DingStats {
  int64_t lines = 0;             // all lines read
  int64_t comment_lines = 0;     // '#' and blank lines
  int64_t malformed_lines = 0;   // no " :: " separator, or over 16 kB
  int64_t misaligned_lines = 0;  // different number of " | " alternatives on the two sides
  int64_t alternatives = 0;      // aligned alternatives looked at
  int64_t sentences = 0;         // alternatives that passed the sentence rule
  int64_t words = 0;             // word entries kept (include_words)
  int64_t dropped_empty = 0;
  int64_t dropped_long = 0;
  int64_t duplicates = 0;
  int64_t pairs = 0;  // kept after dedupe
};

// Removes {..} [..] (..) <..> (nested too), /ABBR/ and ~ref annotations and normalises whitespace.
std::string strip_annotations(std::string_view text);

// The sentence rule above, on already-stripped text.
bool looks_like_sentence(const std::string& de, const std::string& en);

// Pairs of one line (no dedupe); updates `stats` (not `lines`, `duplicates`, `pairs`).
std::vector<SentencePair> parse_ding_line(std::string_view line, const DingOptions& options,
                                          DingStats& stats);

// The whole file, deduped, in file order. Errors name the path when it cannot be read.
std::vector<SentencePair> read_ding(const std::string& path, const DingOptions& options,
                                    DingStats* stats = nullptr);

}  // namespace gpt2p::data
