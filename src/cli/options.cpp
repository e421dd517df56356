#include "gpt2p/cli/options.h"

#include <iostream>

namespace gpt2p::cli {

bool parse_or_help(const std::string& program, const std::string& summary,
                   po::options_description& desc, int argc, char** argv, po::variables_map& vm) {
  desc.add_options()("help,h", "print this help and exit");
  try {
    po::store(po::parse_command_line(argc, argv, desc), vm);
    if (vm.count("help") != 0U) {
      std::cout << "usage: " << program << " [options]\n" << summary << "\n\n" << desc << "\n";
      return false;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    throw UsageError(std::string(e.what()) + " (run '" + program + " --help' for the flags)");
  }
  return true;
}

}  // namespace gpt2p::cli
