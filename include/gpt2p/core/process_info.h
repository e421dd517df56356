// Where and when: the host a process runs on and the current UTC time, as messages, lock files and
// result files record them.
#pragma once

#include <string>

namespace gpt2p {

// This machine's host name, or "unknown-host".
std::string host_name();

// The current UTC time as ISO 8601, e.g. "2026-11-30T17:01:33Z".
std::string utc_timestamp();

}  // namespace gpt2p
