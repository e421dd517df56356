// The MPI runtime and this process's place in the job: the only global state the project has.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

namespace gpt2p {

class RollCall;

// Where this process sits: world rank/size, and its rank among the processes of its node
// (MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)), which picks its GPU.
struct Topology {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  std::string host;
};

// Initialises MPI (thread level SERIALIZED: on GPUs, autograd hooks may call the MPI backend from
// torch's backward thread while the main thread waits in backward) on construction and finalises it
// on destruction.
// MPI errors on MPI_COMM_WORLD return codes instead of aborting, so GPT2P_MPI_CHECK can report
// them. It also starts the process's roll call (roll_call.h), which names the peers a timed-out
// wait is missing.
class MpiEnv {
 public:
  MpiEnv(int* argc, char*** argv);
  ~MpiEnv();
  MpiEnv(const MpiEnv&) = delete;
  MpiEnv& operator=(const MpiEnv&) = delete;

  const Topology& topology() const { return topo_; }

 private:
  Topology topo_;
  std::unique_ptr<RollCall> roll_call_;
  bool owns_ = false;
};

// Topology of an arbitrary communicator (MPI must be initialised).
Topology query_topology(MPI_Comm comm);

}  // namespace gpt2p
