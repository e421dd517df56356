#!/usr/bin/env python3
"""Writes tests/data/tokenizer_cases.jsonl: varied strings for the GPT-2 tokenizer, one
{"text": ...} per line. Deterministic (fixed seed, no external data): rerun to regenerate.

The expected ids are not stored: tests/unit/test_tokenizer.cpp checks decode(encode(x)) == x and
scripts/device/check_tokenizer.py compares our ids with Hugging Face and tiktoken.

    python3 tests/data/make_tokenizer_cases.py [OUT]   # default: next to this script
"""
import itertools
import json
import random
import sys
from pathlib import Path

HAND_WRITTEN = [
    "",
    "Hello world",
    " the",
    "Hello, world!",
    "I'm here  now",
    "I'm here  now\n\n",
    "The quick brown fox jumps over the lazy dog.",
    # German: umlauts, ß, compounds
    "Größe",
    "Die Straße ist nass.",
    "Ärger über Öl und Übermut.",
    "Fußgängerübergänge sind wichtig.",
    "Donaudampfschifffahrtsgesellschaftskapitänsmütze",
    "Ich heiße Jürgen und wohne in München.",
    "Das Mädchen aß ein Brötchen mit Käse.",
    "„Guten Morgen“, sagte sie – und ging.",
    "Er sagte: »Das ist schön!«",
    "ÄÖÜäöüß ẞ",
    "Wie geht's dir? Mir geht's gut.",
    "z.B. usw. d.h. ca. 3,5 km",
    "Preis: 12,99 € (inkl. MwSt.)",
    # punctuation, numbers
    "...!!!???",
    "a,b;c:d.e!f?g",
    "(parentheses) [brackets] {braces} <angles>",
    "3.14159265358979323846",
    "1,000,000 and 1.000.000",
    "2024-01-31T12:34:56Z",
    "Call 555-1234 or +49 (0)30 123456",
    "1st 2nd 3rd 4th 100th",
    "0x1F 0b1010 1e-10 -42 +7",
    "1234567890123456789012345678901234567890",
    "٣٤٥ ४५६ ௧௨௩ ½ ² ³ Ⅻ",
    # whitespace
    " ",
    "  ",
    "   leading spaces",
    "trailing spaces   ",
    "\t",
    "tab\tseparated\tvalues",
    "\n",
    "\n\n\n",
    "line one\nline two\r\nline three\r",
    "mixed \t \n whitespace \n\t ",
    "word\n   indented",
    "    def f():\n        return 1\n",
    "a\u00a0b",  # no-break space
    "a\u3000b",  # ideographic space
    "a\u2003b\u2009c",  # em space, thin space
    "a\u0085b",  # next line
    "a\u2028b\u2029c",  # line/paragraph separator
    "a\u200bb",  # zero-width space (not \s)
    "a\x0bb\x0cc",  # vertical tab, form feed
    "a\x1cb\x1dc\x1ed\x1fe",  # information separators
    "a\u180eb",  # Mongolian vowel separator
    "ends with newline\n",
    "ends with spaces and newline  \n",
    # emoji
    "😀",
    "I ❤️ NY",
    "👩‍👩‍👧‍👦 family",
    "👨🏽‍💻 coder",
    "🏳️‍🌈 flag",
    "🇩🇪🇺🇸🇯🇵",
    "thumbs 👍🏿👍🏻",
    "emoji😀in😀words",
    # CJK, Arabic, Hebrew, other scripts
    "日本語のテキストです。",
    "中文分词测试，你好世界！",
    "한국어 문장입니다.",
    "مرحبا بالعالم",
    "שלום עולם",
    "Здравствуй, мир!",
    "Γειά σου Κόσμε",
    "नमस्ते दुनिया",
    "สวัสดีชาวโลก",
    "mixed English 和中文 and عربي",
    # contractions
    "'s 't 're 've 'm 'll 'd",
    "it's don't you're we've I'm we'll he'd",
    "IT'S DON'T YOU'RE WE'VE I'M WE'LL HE'D",
    "John'S book",
    "rock 'n' roll",
    "''quoted'' 's",
    "’s curly apostrophe don’t",
    "o'clock ma'am y'all",
    # long words
    "a" * 200,
    "ab" * 150,
    "Pneumonoultramicroscopicsilicovolcanoconiosis",
    "supercalifragilisticexpialidocious",
    "x" * 1000 + " end",
    # URLs, email, paths
    "https://www.example.com/path/to/page?query=1&other=two#frag",
    "http://localhost:8080/api/v1/users/42",
    "mailto:someone@example.org",
    "/usr/share/trans/de-en",
    "C:\\Windows\\System32\\drivers",
    "git@github.com:owner/repo.git",
    # code
    "int main() { return 0; }",
    "for (int i = 0; i < n; ++i) {\n  sum += a[i];\n}\n",
    "def foo(x):\n    return x ** 2  # square\n",
    "if (a && b || !c) x <<= 2;",
    "const auto& [k, v] = *it;",
    "SELECT * FROM users WHERE id = 42;",
    "<html><body><p class=\"x\">Hi</p></body></html>",
    '{"key": "value", "list": [1, 2, 3]}',
    "$ echo \"$HOME\" | grep -v '^#'",
    "λx.x → ∀y ∈ ℝ: y² ≥ 0",
    # special-token text (plain text for encode)
    "<|endoftext|>",
    "before<|endoftext|>after",
    "<|endoftext|><|endoftext|>",
    "<|endoftext",
    "|endoftext|>",
    # odd characters
    "\u0000",
    "nul\u0000inside",
    "\u007f del",
    "\ufeffBOM at start",
    "combining: e\u0301 a\u0308 n\u0303",
    "\ufffd replacement",
    "private use \ue000",
    "astral 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𐍈",
    "Ǆ ǅ ǆ ﬁ ﬂ",
    "soft\u00adhyphen",
]

GERMAN = ["Haus", "Straße", "Mädchen", "Fußball", "über", "schön", "Grüße", "Bäcker",
          "Öffnung", "groß", "Käsebrötchen", "weiß", "Tür", "Hände", "müssen"]
ENGLISH = ["the", "cat", "house", "running", "beautiful", "tokenizer", "don't", "it's",
           "parallel", "GPT", "HELLO", "Zürich", "naïve", "café"]
PUNCT = [".", ",", "!", "?", "...", " - ", "--", "'", "\"", "(", ")", ":", ";", "—", "…"]
SPACES = [" ", "  ", "\t", "\n", " \n", "\n\n", "   ", "\u00a0", "\r\n"]
NUMBERS = ["0", "7", "42", "1999", "3.5", "1,234", "100000", "-1", "12:30", "٣"]
EMOJI = ["😀", "🎉", "❤️", "👍🏽", "👩‍💻", "🇩🇪", "🐍", "✨"]
CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'LL"]
OTHER = ["東京", "你好", "سلام", "שלום", "Москва", "ελληνικά", "हिन्दी"]


def combinatorial(rng):
    cases = []
    # every contraction after letters, spaces and digits
    for c, prefix in itertools.product(CONTRACTIONS, ["he", "I", " ", "1", "X"]):
        cases.append(prefix + c + " x")
    # whitespace runs between and after words
    for a, s in itertools.product(["word", "Wort", "42", "!"], SPACES):
        cases.append(a + s + "next" + s)
    # numbers glued to letters and punctuation
    for n, p in itertools.product(NUMBERS, ["", "x", ".", "%", " km"]):
        cases.append("n=" + n + p)
    # random sentences from the pools
    pools = [GERMAN, ENGLISH, PUNCT, SPACES, NUMBERS, EMOJI, CONTRACTIONS, OTHER]
    weights = [6, 6, 3, 3, 2, 1, 1, 1]
    for _ in range(120):
        n = rng.randint(1, 14)
        parts = []
        for _ in range(n):
            pool = rng.choices(pools, weights)[0]
            parts.append(rng.choice(pool))
            if rng.random() < 0.6:
                parts.append(" ")
        cases.append("".join(parts))
    return cases


def main():
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name(
        "tokenizer_cases.jsonl")
    rng = random.Random(20240131)
    cases = HAND_WRITTEN + combinatorial(rng)
    seen = set()
    unique = [c for c in cases if not (c in seen or seen.add(c))]
    with open(out, "w", encoding="utf-8", newline="\n") as f:
        for text in unique:
            f.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
    print(f"{out}: {len(unique)} cases")


if __name__ == "__main__":
    main()
