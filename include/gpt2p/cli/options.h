// Option parsing with Boost.ProgramOptions, shared by every program: --help, --config FILE,
// consistent errors.
//
// Flags are long names written out in full (no prefix guessing: --epoch is not --epochs) and -h.
// A flag that is not known is refused with the closest known ones ("did you mean --epochs?"),
// also for a single dash (-epochs) or underscores (--batch_size).
//
// --config FILE reads flags from an INI file of `name = value` lines: the long flag names without
// the dashes, '#' starting a comment, a switch as `overwrite = true` (or false); no sections.
// Values are taken as written, without quotes: `out = runs/my run` is the directory "runs/my run".
// A flag on the command line wins over the file's line for it. Errors in the file name the file,
// the line and the fix.
#pragma once

#include <boost/program_options.hpp>
#include <functional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "gpt2p/core/names.h"

namespace gpt2p::cli {

namespace po = boost::program_options;

// Thrown for bad usage; run_guarded exits with kExitUsage instead of aborting with a stack of
// noise.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Parses argv, then the file of --config if one is given, into `vm` (adds --help and --config to
// `desc`). Returns false when --help was given (usage was printed on stdout; --config is not read
// then); throws UsageError for unknown flags, bad values, a word no flag takes (--overwrite false)
// or a bad config file, in one line naming the flag (or the file and line) and the fix.
// `base_config`, when given, is asked after the command line and --config are read: a config file
// path it returns (empty: none) fills what neither set, under both (a resume takes the settings of
// the run it continues this way: parallel/train/flags.h).
bool parse_or_help(const std::string& program, const std::string& summary,
                   po::options_description& desc, int argc, char** argv, po::variables_map& vm,
                   const std::function<std::string(const po::variables_map&)>& base_config = {});

// Option values for a config file, in the order they are written: (long flag name, value as it
// is written after the flag on the command line).
using ConfigEntries = std::vector<std::pair<std::string, std::string>>;

// The text of a config file that --config reads back to the same values: an optional `comment`
// (each of its lines written after "# "), then one `name = value` line per entry, in order.
// Throws std::invalid_argument (a bug in the caller, not bad usage) for a name that is not a long
// flag of `desc` (or is help or config), a name given twice, or a value that would not read back
// as it is: one that the flag's type does not parse, or with a '#', a line break, or spaces at
// either end. The flags' notifiers are not run: leave out options that hold a "not set" value a
// notifier refuses (e.g. -1 for a flag that must be positive), so that the file runs again.
// A program writes its configuration once it is resolved (a value may differ from what was
// parsed: an "auto" or a device-dependent default), from a fresh `desc` of its flags (or with
// cli/flag_table.h, which makes the entries from the flags' declarations):
//
//   po::options_description desc;
//   Flags scratch;  // the flags' targets; only their declarations are used
//   add_flags(desc, scratch);
//   const std::string text = cli::to_config_file(
//       {{"epochs", cli::config_value(cfg.epochs)}, {"lr", cli::config_value(cfg.lr)},
//        {"precision", cli::config_value(cfg.precision)}, {"overwrite", cli::config_value(false)}},
//       desc, "PROGRAM --config FILE runs this configuration again");
std::string to_config_file(const ConfigEntries& entries, const po::options_description& desc,
                           const std::string& comment = "");

// A value as the command line (and a config file) spells it, for ConfigEntries.
inline std::string config_value(const std::string& v) { return v; }
inline std::string config_value(const char* v) { return v; }
inline std::string config_value(bool v) { return v ? "true" : "false"; }
// The shortest text that reads back as exactly `v` (e.g. "0.0001", "3e-05"); a whole number below
// 1e15 in digits ("60", "65536").
std::string config_value(double v);
template <class T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int> = 0>
std::string config_value(T v) {
  return std::to_string(v);
}
// An enum with names (core/names.h), as cli::named_value reads it.
template <class E, std::enable_if_t<std::is_enum_v<E>, int> = 0>
std::string config_value(E v) {
  return name_string(v);
}

// The value of a flag whose values are the names of enum E (core/names.h): `--<flag> NAME` sets
// `target`; --help shows target's current name as the default; any other word is a UsageError
// that lists E's names.
template <class E>
po::typed_value<std::string>* named_value(E& target, const char* flag) {
  return po::value<std::string>()
      ->default_value(name_string(target))
      ->notifier([&target, flag](const std::string& word) {
        const auto value = from_name<E>(word);
        if (!value) {
          throw UsageError("--" + std::string(flag) + " '" + word +
                           "' is not one of: " + choices<E>());
        }
        target = *value;
      });
}

}  // namespace gpt2p::cli
