// Every rank of a job must run the same configuration: ranks started with different flags (an
// MPMD launch, a wrapper that edits argv per node) would otherwise disagree on batch shapes and
// step counts, and hang in, or corrupt memory through, collectives of different sizes.
#pragma once

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>

#include "gpt2p/core/mpi_wait.h"

namespace gpt2p::cli {

// Compares this rank's resolved configuration with rank 0's (a hash all-gathered, then rank 0's
// JSON where hashes differ). On a difference every rank ends the job with kExitUsage, and the
// lowest differing rank prints which options differ:
//   "rank 1 was started with --batch-size 32, rank 0 with 16 -- fix: start every rank with the
//    same flags"
// Collective over MPI_COMM_WORLD (call it on every rank, after on_every_rank's checks).
void check_same_config(const nlohmann::json& config,
                       std::chrono::milliseconds timeout = kDefaultCommTimeout);

// The options (as flags) whose values differ between two configurations, e.g.
// "--batch-size 32, rank 0 with 16"; empty when they agree. Keys missing on one side count.
std::string describe_config_difference(const nlohmann::json& mine, const nlohmann::json& theirs,
                                       int their_rank);

}  // namespace gpt2p::cli
