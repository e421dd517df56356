#include "gpt2p/core/mpi_wait.h"

#include <sched.h>

#include <algorithm>
#include <thread>

#include "gpt2p/core/error.h"
#include "gpt2p/core/roll_call.h"

namespace gpt2p {

void wait_all(MPI_Request* requests, int count, std::chrono::milliseconds timeout,
              const std::function<std::string()>& describe) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto deadline = start + timeout;
  // Spin first (most operations finish in microseconds), then back off so that ranks sharing
  // cores leave them to the peer they wait for.
  auto pause = std::chrono::microseconds(0);
  RollCall* roll_call = RollCall::active();
  for (;;) {
    if (roll_call != nullptr) roll_call->serve();
    int done = 0;
    GPT2P_MPI_CHECK(MPI_Testall(count, requests, &done, MPI_STATUSES_IGNORE));
    if (done != 0) return;
    const auto now = Clock::now();
    if (now > deadline) {
      // Which peer is missing: a quarter of the timeout, at most 3 s, for the others to answer.
      std::string who;
      if (roll_call != nullptr) {
        const auto grace = std::clamp(timeout / 4, std::chrono::milliseconds(200),
                                      std::chrono::milliseconds(3000));
        who = "; " + roll_call->describe_missing(grace);
      }
      GPT2P_FAIL(
          describe() << ": not complete after " << std::chrono::duration<double>(timeout).count()
                     << " s (--comm-timeout)" << who,
          "a peer is stuck or dead (a stopped process, a hung GPU, a rank waiting in another "
          "call or failing before it); its own message, if any, is above. Raise "
          "--comm-timeout if one step really takes that long");
    }
    if (now - start < std::chrono::milliseconds(2)) {
      sched_yield();
    } else {
      pause = std::min(std::chrono::microseconds(1000), pause + std::chrono::microseconds(20));
      std::this_thread::sleep_for(pause);
    }
  }
}

void allreduce_ints(int* values, int count, MPI_Op op, MPI_Comm comm,
                    std::chrono::milliseconds timeout, const char* what) {
  MPI_Request r = MPI_REQUEST_NULL;
  GPT2P_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, values, count, MPI_INT, op, comm, &r));
  wait_all(&r, 1, timeout, [what] { return std::string(what) + " (MPI all_reduce)"; });
}

void broadcast_bytes(void* data, int count, int root, MPI_Comm comm,
                     std::chrono::milliseconds timeout, const char* what) {
  MPI_Request r = MPI_REQUEST_NULL;
  GPT2P_MPI_CHECK(MPI_Ibcast(data, count, MPI_BYTE, root, comm, &r));
  wait_all(&r, 1, timeout, [what, root] {
    return std::string(what) + " (MPI broadcast from rank " + std::to_string(root) + ")";
  });
}

void barrier(MPI_Comm comm, std::chrono::milliseconds timeout, const char* what) {
  MPI_Request r = MPI_REQUEST_NULL;
  GPT2P_MPI_CHECK(MPI_Ibarrier(comm, &r));
  wait_all(&r, 1, timeout, [what] { return std::string(what) + " (MPI barrier)"; });
}

}  // namespace gpt2p
