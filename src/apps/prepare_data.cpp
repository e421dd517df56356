// prepare_data: German->English sentence pairs (Ding dictionary, HW5 iwslt14 JSONL, or two
// line-aligned text files) -> one tokenized HDF5 dataset (layout in gpt2p/data/dataset_file.h).
//
//   prepare_data                                   # Ding -> .cache/data/ding-gpt2.h5
//   prepare_data --source jsonl --train t.jsonl --validation v.jsonl --test e.jsonl --out iwslt.h5
//   prepare_data --source parallel --de corpus.de --en corpus.en --out mine.h5
#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>

#include "gpt2p/cli/main_guard.h"
#include "gpt2p/cli/options.h"
#include "gpt2p/core/error.h"
#include "gpt2p/data/bpe_tokenizer.h"
#include "gpt2p/data/corpus.h"
#include "gpt2p/data/dataset_file.h"
#include "gpt2p/data/ding.h"

namespace {

namespace data = gpt2p::data;
namespace po = gpt2p::cli::po;

struct Config {
  std::string source = "ding";
  std::string input, train, validation, test, de, en;
  std::string vocab_dir = data::default_vocab_dir();  // as the trainers and tokenize
  std::string out = ".cache/data/ding-gpt2.h5";
  int64_t max_pairs = 0;
  int64_t max_tokens = 0;
  data::DingOptions ding;
  data::SplitFractions fractions;
};

bool parse(int argc, char** argv, Config& c) {
  po::options_description desc("options");
  size_t max_chars = c.ding.max_chars;
  // clang-format off
  desc.add_options()
      ("source", po::value(&c.source)->default_value(c.source),
       "where the pairs come from: ding | jsonl | parallel")
      ("input", po::value(&c.input),
       "one input file, split by hash into train/validation/test: the Ding dictionary (default "
       "/usr/share/trans/de-en) or a JSONL file of {\"translation\": {\"de\", \"en\"}} rows")
      ("train", po::value(&c.train), "jsonl: the train split's file (with --validation, --test)")
      ("validation", po::value(&c.validation), "jsonl: the validation split's file")
      ("test", po::value(&c.test), "jsonl: the test split's file")
      ("de", po::value(&c.de), "parallel: German text, one sentence per line")
      ("en", po::value(&c.en), "parallel: English text, line i translating line i of --de")
      ("vocab-dir", po::value(&c.vocab_dir)->default_value(c.vocab_dir),
       "GPT-2 tokenizer files (encoder.json + vocab.bpe, or vocab.json + merges.txt); default: "
       "$GPT2P_VOCAB_DIR when set, else .cache/gpt2-vocab")
      ("out", po::value(&c.out)->default_value(c.out),
       "output HDF5 file (written to a temporary, then renamed)")
      ("max-pairs", po::value(&c.max_pairs)->default_value(0),
       "keep only the first N pairs (pairs; 0 = all): of the whole corpus before the hash split, "
       "or of each split file")
      ("max-tokens", po::value(&c.max_tokens)->default_value(0),
       "drop pairs longer than N tokens, counting src + tgt + the 2 end tokens (tokens; 0 = all)")
      ("ding-words", po::bool_switch(&c.ding.include_words),
       "ding: also keep word entries (first synonym), not only example sentences (default off)")
      ("max-chars", po::value(&max_chars)->default_value(max_chars),
       "ding: drop pairs with a side longer than N (bytes)")
      ("validation-fraction", po::value(&c.fractions.validation)->default_value(0.01, "0.01"),
       "share of pairs hashed into validation when splitting one input (fraction)")
      ("test-fraction", po::value(&c.fractions.test)->default_value(0.01, "0.01"),
       "share of pairs hashed into test when splitting one input (fraction)");
  // clang-format on
  po::variables_map vm;
  if (!gpt2p::cli::parse_or_help("prepare_data",
                                 "Tokenize German->English pairs once into an HDF5 dataset.", desc,
                                 argc, argv, vm))
    return false;
  c.ding.max_chars = max_chars;
  const bool split_files = !c.train.empty() || !c.validation.empty() || !c.test.empty();
  using gpt2p::cli::UsageError;
  if (c.source == "ding") {
    if (c.input.empty()) c.input = "/usr/share/trans/de-en";
  } else if (c.source == "jsonl") {
    if (split_files &&
        (c.train.empty() || c.validation.empty() || c.test.empty() || !c.input.empty()))
      throw UsageError(
          "--source jsonl takes either --input FILE or all of --train, --validation, --test");
    if (!split_files && c.input.empty())
      throw UsageError("--source jsonl needs --input FILE or --train F --validation F --test F");
  } else if (c.source == "parallel") {
    if (c.de.empty() || c.en.empty())
      throw UsageError("--source parallel needs --de FILE and --en FILE");
  } else {
    throw UsageError("--source '" + c.source + "' is not one of ding, jsonl, parallel");
  }
  if (c.source != "jsonl" && split_files)
    throw UsageError("--train/--validation/--test are for --source jsonl only");
  if (c.max_pairs < 0 || c.max_tokens < 0)
    throw UsageError("--max-pairs and --max-tokens must be >= 0 (0 = no limit)");
  return true;
}

void cut(std::vector<data::SentencePair>& pairs, int64_t max_pairs) {
  if (max_pairs > 0 && static_cast<int64_t>(pairs.size()) > max_pairs) pairs.resize(max_pairs);
}

// Reads the configured source; `description` says what was read, for the file's attributes.
data::SplitCorpus load(const Config& c, std::string& description) {
  std::ostringstream d;
  std::vector<data::SentencePair> pairs;
  if (c.source == "jsonl" && c.input.empty()) {
    data::SplitCorpus corpus;
    for (const auto& name : data::split_names()) {
      const std::string& file = name == "train"        ? c.train
                                : name == "validation" ? c.validation
                                                       : c.test;
      auto& split = corpus.get(name);
      split = data::dedupe(data::read_jsonl(file));
      cut(split, c.max_pairs);
      std::printf("# read %-10s %8zu pairs from %s\n", name.c_str(), split.size(), file.c_str());
    }
    d << "jsonl train=" << c.train << " validation=" << c.validation << " test=" << c.test;
    description = d.str();
    return corpus;
  }
  if (c.source == "ding") {
    data::DingStats st;
    pairs = data::read_ding(c.input, c.ding, &st);
    std::printf(
        "# ding %s: %lld lines (%lld comments, %lld malformed, %lld misaligned), %lld "
        "alternatives -> %lld sentences + %lld words, dropped %lld empty, %lld long, "
        "%lld duplicates -> %lld pairs\n",
        c.input.c_str(), (long long)st.lines, (long long)st.comment_lines,
        (long long)st.malformed_lines, (long long)st.misaligned_lines, (long long)st.alternatives,
        (long long)st.sentences, (long long)st.words, (long long)st.dropped_empty,
        (long long)st.dropped_long, (long long)st.duplicates, (long long)st.pairs);
    d << "ding " << c.input << (c.ding.include_words ? " (sentences + words)" : " (sentences)");
  } else if (c.source == "jsonl") {
    pairs = data::dedupe(data::read_jsonl(c.input));
    std::printf("# jsonl %s: %zu pairs\n", c.input.c_str(), pairs.size());
    d << "jsonl " << c.input;
  } else {
    pairs = data::dedupe(data::read_parallel(c.de, c.en));
    std::printf("# parallel %s + %s: %zu pairs\n", c.de.c_str(), c.en.c_str(), pairs.size());
    d << "parallel de=" << c.de << " en=" << c.en;
  }
  cut(pairs, c.max_pairs);
  d << ", hash split validation=" << c.fractions.validation << " test=" << c.fractions.test;
  if (c.max_pairs > 0) d << ", first " << c.max_pairs << " pairs";
  description = d.str();
  return data::split_by_hash(pairs, c.fractions);
}

int run(int argc, char** argv) {
  Config c;
  if (!parse(argc, argv, c)) return 0;
  const auto t0 = std::chrono::steady_clock::now();
  auto tok = data::BpeTokenizer::from_dir(c.vocab_dir);
  const data::SpecialTokens special = data::register_special_tokens(tok);

  data::DatasetMeta meta;
  const data::SplitCorpus corpus = load(c, meta.source);
  meta.tokenizer_identity = tok.identity();
  meta.vocab_size = tok.vocab_size();
  meta.special = special;
  if (c.max_tokens > 0) meta.source += ", max " + std::to_string(c.max_tokens) + " tokens";

  std::map<std::string, data::Split> splits;
  std::printf("# %-10s %9s %9s %11s %11s %11s\n", "split", "pairs", "too_long", "src_tokens",
              "tgt_tokens", "max_tokens");
  for (const auto& name : data::split_names()) {
    data::Split& split = splits[name];
    int64_t too_long = 0;
    int64_t longest = 0;
    for (const auto& p : corpus.get(name)) {
      const auto src = tok.encode(p.de);
      const auto tgt = tok.encode(p.en);
      const auto len = static_cast<int64_t>(src.size() + tgt.size() + 2);
      if (c.max_tokens > 0 && len > c.max_tokens) {
        ++too_long;
        continue;
      }
      longest = std::max(longest, len);
      split.add(src, tgt, p.de, p.en);
    }
    std::printf("  %-10s %9lld %9lld %11lld %11lld %11lld\n", name.c_str(), (long long)split.size(),
                (long long)too_long, (long long)split.src_tokens(), (long long)split.tgt_tokens(),
                (long long)longest);
  }
  GPT2P_CHECK(splits.at("train").size() > 0, "no training pairs were kept from " << meta.source,
              "check the input files, or raise --max-tokens / --max-chars");
  data::write_dataset_file(c.out, meta, splits);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("# wrote %s (tokenizer %s, vocab %d) in %.1f s\n", c.out.c_str(),
              meta.tokenizer_identity.c_str(), meta.vocab_size, secs);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return gpt2p::cli::run_guarded(
      "prepare_data", argc, argv,
      [](const gpt2p::Topology&, int argc, char** argv) { return run(argc, argv); });
}
