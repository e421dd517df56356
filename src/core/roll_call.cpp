#include "gpt2p/core/roll_call.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <thread>

#include "gpt2p/core/error.h"
#include "gpt2p/core/mpi_wait.h"

namespace gpt2p {
namespace {

constexpr int kPingTag = 1;
constexpr int kFirstAnswerTag = 2;
constexpr int kAnswerTags = 30000;  // within MPI's guaranteed tag range (32767)

RollCall* active_roll_call = nullptr;

std::string seconds(std::chrono::milliseconds d) {
  const double s = std::chrono::duration<double>(d).count();
  std::array<char, 32> buf{};
  std::snprintf(buf.data(), buf.size(), "%g s", s);
  return buf.data();
}

}  // namespace

std::string describe_ranks(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += std::to_string(ranks[i]);
    if (j > i) out += "-" + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

namespace {

// The ranks of `ranks` grouped by their host, hosts in the order of their first rank.
std::vector<std::pair<std::string, std::vector<int>>> by_host(const std::vector<std::string>& hosts,
                                                              const std::vector<int>& ranks) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (int r : ranks) {
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const auto& g) { return g.first == hosts[r]; });
    if (it == groups.end()) it = groups.insert(groups.end(), {hosts[r], {}});
    it->second.push_back(r);
  }
  return groups;
}

std::string rank_word(const std::vector<int>& ranks) {
  return ranks.size() == 1 ? "rank " : "ranks ";
}

}  // namespace

std::string RollCall::describe_placement(const std::vector<std::string>& hosts) {
  std::vector<int> all(hosts.size());
  std::iota(all.begin(), all.end(), 0);
  std::string out;
  for (const auto& [host, ranks] : by_host(hosts, all)) {
    if (!out.empty()) out += ", ";
    out += host + " (" + rank_word(ranks) + describe_ranks(ranks) + ")";
  }
  return out;
}

RollCall::RollCall(MPI_Comm world, std::chrono::milliseconds timeout) {
  MPI_Request r = MPI_REQUEST_NULL;
  GPT2P_MPI_CHECK(MPI_Comm_idup(world, &comm_, &r));
  wait_all(&r, 1, timeout, [] { return std::string("creating the roll-call communicator"); });
  GPT2P_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  GPT2P_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  GPT2P_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  std::array<char, MPI_MAX_PROCESSOR_NAME> name{};
  int len = 0;
  GPT2P_MPI_CHECK(MPI_Get_processor_name(name.data(), &len));
  std::vector<char> all(static_cast<size_t>(size_) * name.size());
  GPT2P_MPI_CHECK(MPI_Iallgather(name.data(), static_cast<int>(name.size()), MPI_CHAR, all.data(),
                                 static_cast<int>(name.size()), MPI_CHAR, comm_, &r));
  wait_all(&r, 1, timeout, [] { return std::string("gathering the ranks' host names"); });
  hosts_.reserve(size_);
  for (int i = 0; i < size_; ++i) {
    const char* h = all.data() + static_cast<size_t>(i) * name.size();
    hosts_.emplace_back(h, strnlen(h, name.size()));
  }
  post_ping_receive();
  active_roll_call = this;
}

RollCall::~RollCall() {
  if (active_roll_call == this) active_roll_call = nullptr;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized != 0) return;
  if (ping_request_ != MPI_REQUEST_NULL) {
    MPI_Cancel(&ping_request_);
    MPI_Wait(&ping_request_, MPI_STATUS_IGNORE);  // a cancelled receive completes locally
  }
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

RollCall* RollCall::active() { return active_roll_call; }

void RollCall::post_ping_receive() {
  GPT2P_MPI_CHECK(
      MPI_Irecv(&ping_in_, 1, MPI_INT, MPI_ANY_SOURCE, kPingTag, comm_, &ping_request_));
}

void RollCall::serve() {
  for (;;) {
    int arrived = 0;
    MPI_Status status;
    GPT2P_MPI_CHECK(MPI_Test(&ping_request_, &arrived, &status));
    if (arrived == 0) return;
    // The answer carries no data: its tag is what the caller waits for. Freed at once: an
    // empty message needs no buffer, and a caller that stopped waiting must not hold us up.
    MPI_Request answer = MPI_REQUEST_NULL;
    GPT2P_MPI_CHECK(MPI_Isend(nullptr, 0, MPI_INT, status.MPI_SOURCE, ping_in_, comm_, &answer));
    GPT2P_MPI_CHECK(MPI_Request_free(&answer));
    post_ping_receive();
  }
}

std::vector<int> RollCall::missing(std::chrono::milliseconds grace) {
  const int tag = kFirstAnswerTag + (next_call_++ % kAnswerTags);
  // The ping's payload must outlive sends that may never complete (a peer cut off): kept until
  // the process ends, which after a roll call is soon.
  static std::vector<std::unique_ptr<int>> payloads;
  payloads.push_back(std::make_unique<int>(tag));
  std::vector<MPI_Request> answers(size_, MPI_REQUEST_NULL);
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    MPI_Request ping = MPI_REQUEST_NULL;
    GPT2P_MPI_CHECK(MPI_Isend(payloads.back().get(), 1, MPI_INT, p, kPingTag, comm_, &ping));
    GPT2P_MPI_CHECK(MPI_Request_free(&ping));
    GPT2P_MPI_CHECK(MPI_Irecv(nullptr, 0, MPI_INT, p, tag, comm_, &answers[p]));
  }
  const auto deadline = std::chrono::steady_clock::now() + grace;
  for (;;) {
    serve();
    int done = 0;
    GPT2P_MPI_CHECK(MPI_Testall(size_, answers.data(), &done, MPI_STATUSES_IGNORE));
    if (done != 0 || std::chrono::steady_clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::vector<int> silent;
  for (int p = 0; p < size_; ++p) {
    if (answers[p] == MPI_REQUEST_NULL) continue;
    silent.push_back(p);
    MPI_Cancel(&answers[p]);
    MPI_Request_free(&answers[p]);
  }
  return silent;
}

std::string RollCall::describe_missing(std::chrono::milliseconds grace) {
  std::vector<int> silent;
  try {
    silent = missing(grace);
  } catch (const std::exception& e) {
    return std::string("the roll call of the other ranks failed: ") + e.what();
  }
  const std::string within = " within " + seconds(grace);
  if (silent.empty()) {
    return "every other rank answered a roll call" + within +
           ", so none is dead or cut off: one is stuck in a long operation or a different call";
  }
  // Grouped by host: "ranks 2-3 on node2".
  std::string who;
  for (const auto& [host, ranks] : by_host(hosts_, silent)) {
    if (!who.empty()) who += ", ";
    who += rank_word(ranks) + describe_ranks(ranks) + " on " + host;
  }
  return who + " did not answer a roll call" + within + " (stopped, dead or cut off from " +
         hosts_[rank_] + ")";
}

}  // namespace gpt2p
