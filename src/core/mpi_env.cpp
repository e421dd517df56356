#include "gpt2p/core/mpi_env.h"

#include <array>

#include "gpt2p/core/error.h"
#include "gpt2p/core/mpi_wait.h"
#include "gpt2p/core/roll_call.h"

namespace gpt2p {

Topology query_topology(MPI_Comm comm) {
  Topology t;
  GPT2P_MPI_CHECK(MPI_Comm_rank(comm, &t.rank));
  GPT2P_MPI_CHECK(MPI_Comm_size(comm, &t.size));
  MPI_Comm local = MPI_COMM_NULL;
  GPT2P_MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, t.rank, MPI_INFO_NULL, &local));
  GPT2P_MPI_CHECK(MPI_Comm_rank(local, &t.local_rank));
  GPT2P_MPI_CHECK(MPI_Comm_size(local, &t.local_size));
  GPT2P_MPI_CHECK(MPI_Comm_free(&local));
  std::array<char, MPI_MAX_PROCESSOR_NAME> name{};
  int len = 0;
  GPT2P_MPI_CHECK(MPI_Get_processor_name(name.data(), &len));
  t.host.assign(name.data(), len);
  return t;
}

MpiEnv::MpiEnv(int* argc, char*** argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized == 0) {
    int provided = 0;
    GPT2P_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided));
    owns_ = true;
    GPT2P_CHECK(provided >= MPI_THREAD_SERIALIZED,
                "this MPI library grants thread level "
                    << provided << ", below MPI_THREAD_SERIALIZED (" << MPI_THREAD_SERIALIZED
                    << ")",
                "use an MPI built with thread support (Open MPI and MPICH are by default)");
  }
  GPT2P_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  topo_ = query_topology(MPI_COMM_WORLD);
  roll_call_ = std::make_unique<RollCall>(MPI_COMM_WORLD, kDefaultCommTimeout);
}

MpiEnv::~MpiEnv() {
  roll_call_.reset();
  if (owns_) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized == 0) MPI_Finalize();
  }
}

}  // namespace gpt2p
