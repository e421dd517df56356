// GPT-2 BPE tokenizer: known encodings (checked against encoder.json by token_id), pre-tokenizer
// splits, specials, UTF-8 handling, vocabulary formats and errors. Agreement with Hugging Face and
// tiktoken on tests/data/tokenizer_cases.jsonl is checked by scripts/device/check_tokenizer.py.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "gpt2p/core/error.h"
#include "gpt2p/data/bpe_tokenizer.h"
#include "gpt2p/data/byte_unicode.h"
#include "support/errors.h"
#include "support/temp_dir.h"

namespace gpt2p::data {
namespace {

using gpt2p::testing::error_of;

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string test_data() {
  const char* env = std::getenv("GPT2P_TEST_DATA");
  return env != nullptr ? env : "tests/data";
}

// GPT2P_VOCAB_DIR, else the repository's .cache/gpt2-vocab (scripts/setup fetches it).
std::string vocab_dir() {
  const char* env = std::getenv("GPT2P_VOCAB_DIR");
  return env != nullptr ? env : test_data() + "/../../.cache/gpt2-vocab";
}

const BpeTokenizer& gpt2() {
  static const BpeTokenizer tok = BpeTokenizer::from_dir(vocab_dir());
  return tok;
}

std::vector<std::string> cases() {
  std::ifstream in(test_data() + "/tokenizer_cases.jsonl");
  EXPECT_TRUE(in.good()) << "cannot open " << test_data() << "/tokenizer_cases.jsonl";
  std::vector<std::string> out;
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line).at("text"));
  return out;
}

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

void write(const fs::path& p, const std::string& content) {
  std::ofstream(p, std::ios::binary) << content;
}

using gpt2p::testing::TempDir;

TEST(ByteUnicode, MapIsGpt2s) {
  const auto& map = byte_to_unicode();
  EXPECT_EQ(map[' '], "Ġ");
  EXPECT_EQ(map['\n'], "Ċ");
  EXPECT_EQ(map[0], "Ā");
  EXPECT_EQ(map['A'], "A");
  EXPECT_EQ(map[0xE4], "ä");  // printable Latin-1 maps to itself
  EXPECT_EQ(map[0xAD], "Ń");  // soft hyphen is not printable: moved past U+0100
  EXPECT_EQ(std::set<std::string>(map.begin(), map.end()).size(), 256U);
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  EXPECT_EQ(token_to_bytes(bytes_to_token(all)), all);
  EXPECT_EQ(unicode_to_byte(0x120), ' ');
  EXPECT_EQ(unicode_to_byte(0x20), -1);
  EXPECT_THAT(error_of([] { token_to_bytes("a€"); }), HasSubstr("U+20ac"));
}

TEST(ByteUnicode, InvalidUtf8BecomesReplacementLikePython) {
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(utf8_replace_invalid("ok ü 😀"), "ok ü 😀");
  EXPECT_EQ(utf8_replace_invalid("\xFF"), r);
  EXPECT_EQ(utf8_replace_invalid("a\xC3"), "a" + r);           // truncated 2-byte
  EXPECT_EQ(utf8_replace_invalid("\xE2\x82z"), r + "z");       // truncated 3-byte: one U+FFFD
  EXPECT_EQ(utf8_replace_invalid("\xF0\x9F\x98"), r);          // truncated 4-byte: one U+FFFD
  EXPECT_EQ(utf8_replace_invalid("\xED\xA0\x80"), r + r + r);  // surrogate: three
  EXPECT_EQ(utf8_replace_invalid("\xC0\xAF"), r + r);          // overlong: two
  EXPECT_EQ(utf8_replace_invalid("\xF4\x90\x80\x80"), r + r + r + r);  // above U+10FFFF
}

TEST(BpeTokenizer, KnownEncodings) {
  const auto& tok = gpt2();
  EXPECT_EQ(tok.base_vocab_size(), 50257);
  EXPECT_EQ(tok.vocab_size(), 50257);
  EXPECT_THAT(tok.encode("Hello world"), ElementsAre(15496, 995));
  EXPECT_EQ(tok.token_id("Hello"), 15496);
  EXPECT_EQ(tok.token_id("Ġworld"), 995);
  EXPECT_THAT(tok.encode(" the"), ElementsAre(262));
  EXPECT_EQ(tok.token_id("Ġthe"), 262);
  EXPECT_THAT(tok.encode("I'm here  now\n\n"),
              ElementsAre(tok.token_id("I"), tok.token_id("'m"), tok.token_id("Ġhere"),
                          tok.token_id("Ġ"), tok.token_id("Ġnow"), tok.token_id("ĊĊ")));
  EXPECT_TRUE(tok.encode("").empty());
  // a word absent from the vocabulary is merged into several pieces that spell it
  const auto ids = tok.encode(" Donaudampfschifffahrt");
  EXPECT_GT(ids.size(), 2U);
  EXPECT_EQ(tok.decode(ids), " Donaudampfschifffahrt");
}

TEST(BpeTokenizer, PreTokenizerSplitsLikeGpt2) {
  EXPECT_THAT(gpt2_pretokenize("I'm here  now"), ElementsAre("I", "'m", " here", " ", " now"));
  EXPECT_THAT(gpt2_pretokenize("John'S they'll"), ElementsAre("John", "'", "S", " they", "'ll"));
  EXPECT_THAT(gpt2_pretokenize("x\t\ty"), ElementsAre("x", "\t", "\t", "y"));
  EXPECT_THAT(gpt2_pretokenize("end   "), ElementsAre("end", "   "));
  EXPECT_THAT(gpt2_pretokenize("a1b 22!? Größe"),
              ElementsAre("a", "1", "b", " 22", "!?", " Größe"));
  EXPECT_THAT(gpt2_pretokenize("日本 😀😀"), ElementsAre("日本", " 😀😀"));
  EXPECT_THAT(gpt2_pretokenize("a\n\n b"), ElementsAre("a", "\n\n", " b"));
}

TEST(BpeTokenizer, RoundTripsEveryCase) {
  const auto all = cases();
  ASSERT_GE(all.size(), 300U);
  for (const auto& text : all) {
    EXPECT_EQ(gpt2().decode(gpt2().encode(text)), text) << "case: " << nlohmann::json(text);
    EXPECT_EQ(gpt2().decode(gpt2().encode_with_specials(text)), text);
  }
}

TEST(BpeTokenizer, SpecialTokens) {
  BpeTokenizer tok = gpt2();
  EXPECT_THAT(tok.encode_with_specials("<|endoftext|>"), ElementsAre(50256));
  EXPECT_GT(tok.encode("<|endoftext|>").size(), 1U);  // plain text for encode()
  EXPECT_EQ(tok.add_special_token("<|pad|>"), 50257);
  EXPECT_EQ(tok.add_special_token("<|sep|>"), 50258);
  EXPECT_EQ(tok.add_special_token("<|pad|>"), 50257);
  EXPECT_EQ(tok.add_special_token("<|endoftext|>"), 50256);
  EXPECT_EQ(tok.vocab_size(), 50259);
  EXPECT_EQ(tok.base_vocab_size(), 50257);
  EXPECT_EQ(tok.token_id("<|sep|>"), 50258);
  EXPECT_EQ(gpt2().vocab_size(), 50257);  // the copy's specials are its own
  const auto ids = tok.encode_with_specials("a<|pad|>b<|endoftext|><|sep|>");
  EXPECT_THAT(ids, ElementsAre(64, 50257, 65, 50256, 50258));
  EXPECT_EQ(tok.decode(ids), "a<|pad|>b<|endoftext|><|sep|>");
  // A model's output: the added specials are dropped, the vocabulary's own <|endoftext|> is text.
  EXPECT_EQ(tok.decode_without_added({64, 50257, 65, 50256, 50258}), "ab<|endoftext|>");
  // leftmost first, then longest
  EXPECT_EQ(tok.add_special_token("<|pad|>x"), 50259);
  EXPECT_THAT(tok.encode_with_specials("<|pad|>x<|pad|>"), ElementsAre(50259, 50257));
  EXPECT_THAT(error_of([&] { tok.add_special_token(""); }), HasSubstr("cannot be empty"));
}

TEST(BpeTokenizer, DecodeErrorsAndReplacement) {
  const auto& tok = gpt2();
  const int32_t c3 = tok.token_id("Ã");  // the byte 0xC3 alone
  const int32_t bc = tok.token_id("¼");  // the byte 0xBC
  EXPECT_EQ(tok.decode({c3, bc}), "ü");
  EXPECT_EQ(tok.decode({c3}), "\xEF\xBF\xBD");
  EXPECT_THAT(error_of([&] {
                tok.decode({15496, 50257});
              }),
              HasSubstr("cannot decode id 50257 at position 1"));
  EXPECT_THAT(error_of([&] { tok.decode({-1}); }), HasSubstr("cannot decode id -1"));
  EXPECT_THAT(error_of([&] { tok.token_id("no such token"); }),
              HasSubstr("neither a special token nor a token"));
}

TEST(BpeTokenizer, InvalidUtf8InputNamesTheByteOffset) {
  const auto& tok = gpt2();
  EXPECT_THAT(error_of([&] {
                tok.encode(
                    "ab\xFF"
                    "cd");
              }),
              HasSubstr("not valid UTF-8 at byte offset 2"));
  EXPECT_THAT(error_of([&] { tok.encode("Grüße \xC3"); }),
              HasSubstr("not valid UTF-8 at byte offset 8"));
  EXPECT_THAT(error_of([&] { tok.encode_with_specials("<|endoftext|>x\xC3"); }),
              HasSubstr("byte offset 14"));
}

TEST(BpeTokenizer, HuggingFaceFilesGiveSameIdsAndIdentity) {
  TempDir dir;
  // Hugging Face's vocab.json is compact JSON; the npm encoder.json has spaces: same content.
  const auto vocab = nlohmann::json::parse(read(fs::path(vocab_dir()) / "encoder.json"));
  write(dir.path() / "vocab.json", vocab.dump());
  write(dir.path() / "merges.txt", read(fs::path(vocab_dir()) / "vocab.bpe"));
  const auto hf = BpeTokenizer::from_dir(dir.str());
  EXPECT_EQ(hf.identity(), gpt2().identity());
  EXPECT_THAT(gpt2().identity(), ::testing::MatchesRegex("gpt2-bpe:[0-9a-f]{16}"));
  for (const auto& text : cases()) EXPECT_EQ(hf.encode(text), gpt2().encode(text));
}

TEST(BpeTokenizer, IdentityFollowsTheMerges) {
  TempDir dir;
  fs::copy_file(fs::path(vocab_dir()) / "encoder.json", dir.path() / "encoder.json");
  std::string merges = read(fs::path(vocab_dir()) / "vocab.bpe");
  const size_t header_end = merges.find('\n');
  const size_t first_merge_end = merges.find('\n', header_end + 1);
  ASSERT_EQ(merges.substr(header_end + 1, first_merge_end - header_end), "Ġ t\n");
  merges.erase(header_end + 1, first_merge_end - header_end);
  write(dir.path() / "vocab.bpe", merges);
  const auto fewer = BpeTokenizer::from_dir(dir.str());
  EXPECT_NE(fewer.identity(), gpt2().identity());
  EXPECT_THAT(gpt2().encode(" t"), ElementsAre(gpt2().token_id("Ġt")));
  EXPECT_THAT(fewer.encode(" t"), ElementsAre(gpt2().token_id("Ġ"), gpt2().token_id("t")));
}

TEST(BpeTokenizer, MissingOrBrokenFilesAreNamed) {
  const std::string missing = error_of([] { BpeTokenizer::from_dir("/nonexistent/vocab"); });
  EXPECT_THAT(missing, HasSubstr("'/nonexistent/vocab' (no such directory)"));
  EXPECT_THAT(missing, HasSubstr("encoder.json + vocab.bpe"));
  EXPECT_THAT(missing, HasSubstr("vocab.json + merges.txt"));

  TempDir dir;
  write(dir.path() / "vocab.json", R"({"a": 0, "b": 1, "ab": 2})");
  write(dir.path() / "merges.txt", "#version: 0.2\na b\nab\n");
  EXPECT_THAT(error_of([&] { BpeTokenizer::from_dir(dir.str()); }),
              HasSubstr("merges.txt:3: 'ab' is not a merge"));
  write(dir.path() / "merges.txt", "#version: 0.2\na b\n");
  write(dir.path() / "vocab.json", R"({"a": 0, "b": 5})");
  EXPECT_THAT(error_of([&] { BpeTokenizer::from_dir(dir.str()); }),
              HasSubstr("token 'b' has id 5, expected an integer in [0, 2)"));
  write(dir.path() / "vocab.json", R"({"a": 0, )");
  EXPECT_THAT(error_of([&] { BpeTokenizer::from_dir(dir.str()); }),
              HasSubstr("vocab.json: not valid JSON"));
}

TEST(BpeTokenizer, TinyVocabularyMergesByRank) {
  TempDir dir;
  // ranks: "b c" before "a b", so "abc" -> a + bc; then "a bc" -> abc
  write(dir.path() / "vocab.json", R"({"a": 0, "b": 1, "c": 2, "bc": 3, "ab": 4, "abc": 5})");
  write(dir.path() / "merges.txt", "#version: 0.2\nb c\na b\na bc\n");
  const auto tok = BpeTokenizer::from_dir(dir.str());
  EXPECT_THAT(tok.encode("abc"), ElementsAre(5));
  EXPECT_THAT(tok.encode("abab"), ElementsAre(4, 4));
  EXPECT_THAT(tok.encode("cba"), ElementsAre(2, 1, 0));
  EXPECT_THAT(error_of([&] { tok.encode("abd"); }),
              HasSubstr("'d', which is not in the vocabulary"));
}

TEST(BpeTokenizer, CacheAndThreadsDoNotChangeResults) {
  const auto all = cases();
  std::vector<std::vector<int32_t>> first;
  for (const auto& t : all) first.push_back(gpt2().encode(t));  // fills the cache
  const auto fresh = BpeTokenizer::from_dir(vocab_dir());       // empty cache
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      for (size_t i = 0; i < all.size(); ++i) {
        const auto& tok = k % 2 == 0 ? gpt2() : fresh;
        if (tok.encode(all[(i + k * 37) % all.size()]) != first[(i + k * 37) % all.size()]) {
          ++mismatches[k];
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_THAT(mismatches, ElementsAre(0, 0, 0, 0));
}

// The tokenize program sits in the build directory, one level above this test binary.
// The programs' default vocabulary: $GPT2P_VOCAB_DIR unless it is empty or unset.
TEST(BpeTokenizer, DefaultVocabDirIsTheEnvironmentsElseTheCache) {
  const char* was = std::getenv("GPT2P_VOCAB_DIR");
  const std::string saved = was != nullptr ? was : "";
  ::setenv("GPT2P_VOCAB_DIR", "/somewhere/vocab", 1);
  EXPECT_EQ(default_vocab_dir(), "/somewhere/vocab");
  ::setenv("GPT2P_VOCAB_DIR", "", 1);
  EXPECT_EQ(default_vocab_dir(), ".cache/gpt2-vocab");
  ::unsetenv("GPT2P_VOCAB_DIR");
  EXPECT_EQ(default_vocab_dir(), ".cache/gpt2-vocab");
  if (was != nullptr) ::setenv("GPT2P_VOCAB_DIR", saved.c_str(), 1);
}

std::string tokenize_binary() {
  return (fs::read_symlink("/proc/self/exe").parent_path().parent_path() / "tokenize").string();
}

// Runs tokenize with `flags` on `input`; returns its exit status, stdout in `out`.
int run_tokenize(const std::string& flags, const std::string& input, std::string& out) {
  const TempDir dir;
  write(dir / "in.jsonl", input);
  const std::string cmd = tokenize_binary() + " --vocab-dir " + vocab_dir() + " " + flags + " < " +
                          (dir / "in.jsonl") + " > " + (dir / "out.jsonl") + " 2>&1";
  const int status = std::system(cmd.c_str());
  out = read(dir / "out.jsonl");
  return status;
}

TEST(TokenizeProgram, BlankLinesAreSkippedAndErrorsKeepTheInputLineNumbers) {
  ASSERT_TRUE(fs::exists(tokenize_binary())) << tokenize_binary() << " (build target tokenize)";
  std::string out;
  ASSERT_EQ(run_tokenize("", "{\"text\": \"Hello world\"}\n\n  \r\n{\"text\": \"Hello\"}\n", out),
            0)
      << out;
  EXPECT_EQ(out, "{\"ids\":[15496,995]}\n{\"ids\":[15496]}\n");
  ASSERT_EQ(run_tokenize("--decode", "\n{\"ids\": [15496, 995]}\n\n", out), 0) << out;
  EXPECT_EQ(out, "{\"text\":\"Hello world\"}\n");
  EXPECT_NE(run_tokenize("", "\n\n{\"txt\": 1}\n", out), 0);
  EXPECT_THAT(out, HasSubstr("stdin line 3 has no \"text\" field")) << out;
}

}  // namespace
}  // namespace gpt2p::data
