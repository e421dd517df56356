// Private to src/cli/options.cpp: the long flags of an options_description by name, and the
// names closest to a misspelled one, for the "did you mean --epochs?" of errors on the command
// line and in config files.
#pragma once

#include <string>
#include <vector>

#include "gpt2p/cli/options.h"

namespace gpt2p::cli {

// The long names of `desc`'s options, in the order they were declared.
std::vector<std::string> long_names(const po::options_description& desc);

// The option of `desc` whose long name is `name`; null when there is none.
const po::option_description* find_long(const po::options_description& desc,
                                        const std::string& name);

// A word as a long name would spell it: no leading dashes, lower case, '-' for '_' and spaces.
std::string as_flag_name(const std::string& word);

// ": did you mean --a, --b or --c?" (`prefix` before each name), or "" when nothing is close.
// The names are those of `names` closest to `word`, at most 3 (flag_names.cpp says which).
std::string did_you_mean(const std::string& word, const std::vector<std::string>& names,
                         const std::string& prefix);

}  // namespace gpt2p::cli
