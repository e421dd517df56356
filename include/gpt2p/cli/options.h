// Option parsing with Boost.ProgramOptions, shared by every program: --help, consistent errors.
#pragma once

#include <boost/program_options.hpp>
#include <string>

#include "gpt2p/core/names.h"

namespace gpt2p::cli {

namespace po = boost::program_options;

// Thrown for bad usage; run_guarded exits with kExitUsage instead of aborting with a stack of
// noise.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Parses argv into `vm` (adds --help to `desc`). Returns false when --help was given (usage was
// printed on stdout); throws UsageError for unknown flags or bad values, naming the flag and the
// fix.
bool parse_or_help(const std::string& program, const std::string& summary,
                   po::options_description& desc, int argc, char** argv, po::variables_map& vm);

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
