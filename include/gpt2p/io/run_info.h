// What a result file records about the run that made it: build, libraries, host, time.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace gpt2p::io {

// {"git_commit", "version", "torch", "mpi", "hdf5", "boost", "compiler"}.
nlohmann::json library_versions();

// UTC time as ISO 8601, e.g. "2026-11-30T17:01:33Z".
std::string utc_timestamp();

}  // namespace gpt2p::io
