#include "gpt2p/cli/config_agreement.h"

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "gpt2p/cli/main_guard.h"
#include "gpt2p/cli/options.h"
#include "gpt2p/core/error.h"
#include "gpt2p/io/json_input.h"

namespace gpt2p::cli {
namespace {

// The flag a TrainConfig JSON key comes from: "batch_size" -> "--batch-size".
std::string flag_of(const std::string& key) {
  std::string flag = key == "comm_timeout_s" ? "comm_timeout" : key;
  for (char& ch : flag) {
    if (ch == '_') ch = '-';
  }
  return "--" + flag;
}

std::string value_of(const nlohmann::json& config, const std::string& key) {
  if (!config.contains(key)) return "<not set>";
  const auto& v = config.at(key);
  return v.is_string() ? (v.get<std::string>().empty() ? "''" : v.get<std::string>()) : v.dump();
}

}  // namespace

std::string describe_config_difference(const nlohmann::json& mine, const nlohmann::json& theirs,
                                       int their_rank) {
  std::vector<std::string> keys;
  for (const auto& [key, value] : theirs.items()) keys.push_back(key);
  for (const auto& [key, value] : mine.items()) {
    if (!theirs.contains(key)) keys.push_back(key);
  }
  std::string out;
  for (const auto& key : keys) {
    if (mine.contains(key) && theirs.contains(key) && mine.at(key) == theirs.at(key)) continue;
    if (!out.empty()) out += "; ";
    out += flag_of(key) + " " + value_of(mine, key) + ", rank " + std::to_string(their_rank) +
           " with " + value_of(theirs, key);
  }
  return out;
}

void check_same_config(const nlohmann::json& config, std::chrono::milliseconds timeout) {
  int rank = 0;
  int size = 1;
  GPT2P_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  GPT2P_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
  if (size == 1) return;
  std::string text = config.dump();
  const uint64_t mine = std::hash<std::string>{}(text);
  std::vector<uint64_t> hashes(static_cast<size_t>(size));
  MPI_Request r = MPI_REQUEST_NULL;
  GPT2P_MPI_CHECK(
      MPI_Iallgather(&mine, 1, MPI_UINT64_T, hashes.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD, &r));
  wait_all(&r, 1, timeout, [] { return std::string("comparing the ranks' configurations"); });
  bool same = true;
  for (uint64_t h : hashes) same = same && h == hashes[0];
  if (same) return;
  // Some rank differs: rank 0's configuration to everyone, then each rank names its differences.
  int length = static_cast<int>(text.size());
  broadcast_bytes(&length, static_cast<int>(sizeof length), 0, MPI_COMM_WORLD, timeout,
                  "sending rank 0's configuration");
  std::string reference = rank == 0 ? text : std::string(static_cast<size_t>(length), '\0');
  broadcast_bytes(reference.data(), length, 0, MPI_COMM_WORLD, timeout,
                  "sending rank 0's configuration");
  on_every_rank(
      [&] {
        if (rank == 0) return;
        const auto difference =
            describe_config_difference(config,
                                       io::parse_json(reference, "rank 0's configuration",
                                                      "start every rank with the same build"),
                                       0);
        if (difference.empty()) return;
        throw UsageError("ranks run different configurations: rank " + std::to_string(rank) +
                         " was started with " + difference +
                         " -- fix: start every rank with the same flags");
      },
      timeout);
}

}  // namespace gpt2p::cli
