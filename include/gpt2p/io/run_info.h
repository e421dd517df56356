// What a result file records about the run that made it: build, libraries, host, time.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace gpt2p::io {

// {"git_commit", "version", "torch", "mpi", "hdf5", "boost", "compiler"}.
nlohmann::json library_versions();

}  // namespace gpt2p::io
