// tokenize: GPT-2 BPE over JSON lines. stdin {"text": "..."} -> stdout {"ids": [...]}, or the
// reverse with --decode. Blank (or all-whitespace) lines are skipped, as JSON-lines readers do:
// they write nothing and are still counted in the line numbers of errors. Used by
// scripts/device/check_tokenizer.py to compare with Hugging Face. Started at a terminal without
// piped input, it says on stderr what it waits for, then reads the lines typed.
#include <unistd.h>

#include <climits>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "gpt2p/cli/main_guard.h"
#include "gpt2p/cli/options.h"
#include "gpt2p/core/error.h"
#include "gpt2p/data/bpe_tokenizer.h"
#include "gpt2p/io/json_input.h"

namespace {

// The value of `key` in a JSON-object line, with errors naming the line.
nlohmann::json field(const std::string& line, long line_no, const char* key) {
  const nlohmann::json obj = gpt2p::io::parse_json(
      line, "stdin line " + std::to_string(line_no),
      std::string("write one JSON object per line, e.g. {\"") + key + "\": ...}");
  GPT2P_CHECK(obj.is_object() && obj.contains(key),
              "stdin line " << line_no << " has no \"" << key << "\" field",
              "write one JSON object per line, e.g. {\"" << key << "\": ...}");
  return obj[key];
}

}  // namespace

int main(int argc, char** argv) {
  return gpt2p::cli::run_guarded(
      "tokenize", argc, argv, [](const gpt2p::Topology&, int argc, char** argv) {
        namespace po = gpt2p::cli::po;
        po::options_description desc("options");
        std::string vocab_dir;
        desc.add_options()(
            "vocab-dir", po::value(&vocab_dir)->default_value(gpt2p::data::default_vocab_dir()),
            "directory with encoder.json + vocab.bpe or vocab.json + merges.txt (default: "
            "$GPT2P_VOCAB_DIR, else .cache/gpt2-vocab)")(
            "decode", po::bool_switch(),
            "read {\"ids\": [...]} lines, write {\"text\": ...} lines")(
            "specials", po::bool_switch(),
            "recognise special tokens such as <|endoftext|> in the text (default: off, they are "
            "plain text)");
        po::variables_map vm;
        if (!gpt2p::cli::parse_or_help(
                "tokenize",
                "GPT-2 BPE over JSON lines: {\"text\": ...} on stdin -> {\"ids\": [...]} on stdout "
                "(--decode: the reverse). Blank lines are skipped (no output line); errors name "
                "the "
                "input line.",
                desc, argc, argv, vm)) {
          return 0;
        }
        const bool decode = vm["decode"].as<bool>();
        const bool specials = vm["specials"].as<bool>();
        const auto tok = gpt2p::data::BpeTokenizer::from_dir(vocab_dir);

        if (isatty(STDIN_FILENO) != 0) {
          std::cerr << "tokenize: reading JSON lines from the terminal, one "
                    << (decode ? "{\"ids\": [15496, 995]}" : "{\"text\": \"Hallo Welt\"}")
                    << " per line, Ctrl-D to end; or pipe them in: "
                    << (decode ? "echo '{\"ids\": [15496, 995]}' | tokenize --decode"
                               : "echo '{\"text\": \"Hallo Welt\"}' | tokenize")
                    << std::endl;
        }
        std::ios::sync_with_stdio(false);
        std::string line;
        long line_no = 0;
        while (std::getline(std::cin, line)) {
          ++line_no;
          if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank: skipped
          nlohmann::json out;
          if (decode) {
            const nlohmann::json ids = field(line, line_no, "ids");
            GPT2P_CHECK(ids.is_array(), "stdin line " << line_no << ": \"ids\" is not an array",
                        "write {\"ids\": [15496, 995]}");
            std::vector<int32_t> v;
            v.reserve(ids.size());
            for (const auto& id : ids) {
              GPT2P_CHECK(
                  id.is_number_integer() && id.get<int64_t>() >= INT32_MIN &&
                      id.get<int64_t>() <= INT32_MAX,
                  "stdin line " << line_no << ": id " << id.dump() << " is not a 32-bit integer",
                  "write {\"ids\": [15496, 995]}");
              v.push_back(id.get<int32_t>());
            }
            try {
              out["text"] = tok.decode(v);
            } catch (const gpt2p::Error& e) {
              GPT2P_FAIL("stdin line " << line_no << ": " << e.what_happened(), e.hint());
            }
          } else {
            const nlohmann::json text = field(line, line_no, "text");
            GPT2P_CHECK(text.is_string(), "stdin line " << line_no << ": \"text\" is not a string",
                        "write {\"text\": \"Hello world\"}");
            const auto& s = text.get_ref<const std::string&>();
            out["ids"] = specials ? tok.encode_with_specials(s) : tok.encode(s);
          }
          std::cout << out.dump() << '\n';
        }
        std::cout.flush();
        GPT2P_CHECK(std::cout.good(), "cannot write to stdout", "check the output pipe or disk");
        return 0;
      });
}
