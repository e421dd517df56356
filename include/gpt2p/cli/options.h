// Option parsing with Boost.ProgramOptions, shared by every program: --help, consistent errors.
#pragma once

#include <boost/program_options.hpp>
#include <string>

namespace gpt2p::cli {

namespace po = boost::program_options;

// Thrown for bad usage; run_guarded exits with kExitUsage instead of aborting with a stack of noise.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Parses argv into `vm` (adds --help to `desc`). Returns false when --help was given (usage was
// printed on stdout); throws UsageError for unknown flags or bad values, naming the flag and the fix.
bool parse_or_help(const std::string& program, const std::string& summary,
                   po::options_description& desc, int argc, char** argv, po::variables_map& vm);

}  // namespace gpt2p::cli
