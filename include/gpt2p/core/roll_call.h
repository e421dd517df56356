// Who stopped answering. When a wait on MPI runs past --comm-timeout, MPI itself cannot say which
// peer is missing: a collective waits on all of them. The roll call asks every rank directly: it
// sends each a ping on a communicator of its own and names the ranks (and their hosts) whose
// answer does not come back within a grace period. A rank answers while it waits in MPI (every
// wait of ours serves pings, mpi_wait.h); a rank that is stopped, dead, computing for longer than
// the grace period, or on the far side of a network partition does not.
//
// One RollCall exists per process, made by MpiEnv after MPI_Init; the waits find it through
// RollCall::active(). Everything here runs on the thread that calls MPI.
#pragma once

#include <mpi.h>

#include <chrono>
#include <string>
#include <vector>

namespace gpt2p {

class RollCall {
 public:
  // Collective over `world`: duplicates it and gathers every rank's host name. Waits at most
  // `timeout` for the others.
  RollCall(MPI_Comm world, std::chrono::milliseconds timeout);
  ~RollCall();  // cancels the standing receive; frees the communicator
  RollCall(const RollCall&) = delete;
  RollCall& operator=(const RollCall&) = delete;

  // The process's roll call, or nullptr (before MPI_Init, after MPI_Finalize, in unit tests).
  static RollCall* active();

  // Answers the pings that have arrived. Cheap: one MPI_Test when there is none.
  void serve();

  // Pings every other rank and waits up to `grace` for the answers (serving pings meanwhile).
  // Returns the ranks that did not answer, in order.
  std::vector<int> missing(std::chrono::milliseconds grace);

  // "ranks 2-3 on node2 did not answer within 3 s (stopped, dead or cut off from node1)", or
  // "every other rank answered within 3 s (...)": one clause for an error message.
  std::string describe_missing(std::chrono::milliseconds grace);

  // The host of each world rank (MPI_Get_processor_name), as gathered at start.
  const std::vector<std::string>& hosts() const { return hosts_; }

  // "node1 (ranks 0-1), node2 (ranks 2-3)": where the ranks run, grouped by host in rank order.
  static std::string describe_placement(const std::vector<std::string>& hosts);

 private:
  void post_ping_receive();

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::vector<std::string> hosts_;
  MPI_Request ping_request_ = MPI_REQUEST_NULL;
  int ping_in_ = 0;    // the received ping: the tag its answer goes back on
  int next_call_ = 0;  // numbers this rank's roll calls, so late answers never match a new one
};

// "2", "2-3", "0-1, 4": a sorted list of ranks, runs collapsed.
std::string describe_ranks(const std::vector<int>& ranks);

}  // namespace gpt2p
