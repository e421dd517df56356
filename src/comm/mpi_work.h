// Private to the MPI backend (src/comm/mpi_communicator.cpp): how a tensor's bytes go through MPI
// calls, and the handle those calls return. A dtype travels as the MPI type that moves its bytes
// unchanged; a tensor goes in pieces of at most `int` elements; a reduction works on a staged
// buffer MPI can sum. An MpiWork holds the calls' requests and, once they are complete, the step
// that brings the result into the caller's tensor.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "gpt2p/comm/communicator.h"
#include "gpt2p/core/mpi_wait.h"

namespace gpt2p::comm::mpi {

// The MPI type that moves a dtype's bytes unchanged (bfloat16 travels as raw 16-bit words).
MPI_Datatype wire_type(torch::ScalarType t);

// The MPI reduction for `op`: always MPI_SUM (avg = sum, then divide by the world size).
MPI_Op mpi_op(ReduceOp op);

// Calls f(element_offset, count) for consecutive pieces of at most `chunk` elements.
template <class F>
void for_chunks(int64_t numel, int64_t chunk, F&& f) {
  for (int64_t offset = 0; offset < numel; offset += chunk) {
    f(offset, static_cast<int>(std::min(chunk, numel - offset)));
  }
}

// The address of t's element `element` (t contiguous).
char* at(const torch::Tensor& t, int64_t element);

// What a wait names when it times out: "recv from rank 1 on 2 ranks".
std::string describe_op(const char* op, int peer, int world);

// Operation in flight: MPI requests, then `finish` (divide for avg, copy back into the caller's
// tensor) once they are complete. Captured tensors stay alive until then.
class MpiWork final : public Work {
 public:
  struct Place {
    const char* op;
    int peer;  // -1 for collectives
    int world;
    std::chrono::milliseconds timeout;
  };
  MpiWork(std::vector<MPI_Request> requests, std::function<void()> finish, Place place)
      : requests_(std::move(requests)), finish_(std::move(finish)), place_(place) {}
  ~MpiWork() override;
  MpiWork(const MpiWork&) = delete;
  MpiWork& operator=(const MpiWork&) = delete;

  void wait() override;
  bool is_completed() override;

 private:
  std::vector<MPI_Request> requests_;
  std::function<void()> finish_;
  Place place_;
  bool done_ = false;
  bool timed_out_ = false;  // a wait threw: the peer may never come
  struct Abandoned {
    std::vector<MPI_Request> requests;
    std::function<void()> keep_alive;
  };
};

// A reduction's buffer: contiguous, in a dtype MPI can sum (bfloat16 -> float32), and the step
// that brings the result back into the caller's tensor.
struct Staged {
  torch::Tensor buffer;
  std::function<void()> finish;
};

// `host`: the tensor lives in CUDA memory, which goes through host memory.
Staged stage_reduce(torch::Tensor& tensor, ReduceOp op, int world, bool host);

}  // namespace gpt2p::comm::mpi
