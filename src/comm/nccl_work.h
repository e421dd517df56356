// Private to the NCCL backend (src/comm/nccl_communicator.cpp, compiled only with CUDA): the
// handles its calls return. A Work owns the event recorded after its NCCL calls on the
// communicator's stream and keeps the communicator (NcclState) alive while it may still be
// waited on.
#pragma once

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <nccl.h>

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gpt2p/comm/communicator.h"
#include "gpt2p/comm/cuda_check.h"
#include "gpt2p/core/error.h"

namespace gpt2p::comm::nccl {

// A CUDA event without timing, owned.
class Event {
 public:
  Event() { GPT2P_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming)); }
  ~Event() {
    if (event_ != nullptr) cudaEventDestroy(event_);
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record(cudaStream_t s) { GPT2P_CUDA_CHECK(cudaEventRecord(event_, s)); }
  void block(cudaStream_t s) { GPT2P_CUDA_CHECK(cudaStreamWaitEvent(s, event_, 0)); }
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// The NCCL communicator, shared by the Communicator and its Works (a Work may outlive a call).
struct NcclState {
  ncclComm_t comm = nullptr;
  int device = 0;
  std::chrono::milliseconds timeout{60000};
  bool aborted = false;

  ~NcclState() {
    if (comm != nullptr && !aborted) {
      cudaSetDevice(device);
      // Unwinding after an error ends in MPI_Abort: ncclCommDestroy would first wait for queued
      // work that a dead or stuck peer never completes (c10d aborts for the same reason).
      if (std::uncaught_exceptions() > 0) {
        ncclCommAbort(comm);
      } else {
        ncclCommDestroy(comm);
      }
    }
  }

  [[noreturn]] void abort_and_throw(const std::string& what, const char* file, int line) {
    if (!aborted) ncclCommAbort(comm);
    aborted = true;
    ::gpt2p::detail::throw_error(
        what + " (the NCCL communicator was aborted)",
        "a peer rank has probably died or diverged (made different calls); look "
        "at the other ranks' errors, rerun with NCCL_DEBUG=WARN, or raise the "
        "timeout if the step is legitimately slow",
        file, line);
  }
};

class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<NcclState> state, std::shared_ptr<Event> done,
           std::vector<torch::Tensor> keep, std::function<void()> finish)
      : state_(std::move(state)),
        done_(std::move(done)),
        keep_(std::move(keep)),
        finish_(std::move(finish)) {}

  void wait() override {
    if (waited_) return;
    waited_ = true;
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(state_->device));
    done_->block(c10::cuda::getCurrentCUDAStream(state_->device).stream());
    if (finish_) finish_();  // copy-backs, queued on the current stream after the wait
  }

  void synchronize() override {
    const auto start = std::chrono::steady_clock::now();
    while (!is_completed()) {
      ncclResult_t async_error = ncclSuccess;
      GPT2P_NCCL_CHECK(ncclCommGetAsyncError(state_->comm, &async_error));
      if (async_error != ncclSuccess && async_error != ncclInProgress) {
        state_->abort_and_throw(
            std::string("NCCL reported an asynchronous error: ") + ncclGetErrorString(async_error),
            __FILE__, __LINE__);
      }
      const auto waited = std::chrono::steady_clock::now() - start;
      if (waited > state_->timeout) {
        state_->abort_and_throw("NCCL operation did not complete within " +
                                    std::to_string(state_->timeout.count()) + " ms",
                                __FILE__, __LINE__);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    wait();
    if (finish_) c10::cuda::getCurrentCUDAStream(state_->device).synchronize();
  }

  bool is_completed() override {
    const cudaError_t rc = cudaEventQuery(done_->get());
    if (rc == cudaErrorNotReady) {
      (void)cudaGetLastError();  // not an error: clear it so later checks do not see it
      return false;
    }
    GPT2P_CUDA_CHECK(rc);
    return true;
  }

 private:
  std::shared_ptr<NcclState> state_;
  std::shared_ptr<Event> done_;  // shared by the Works of one batch_isend_irecv
  std::vector<torch::Tensor> keep_;
  std::function<void()> finish_;
  bool waited_ = false;
};

// A contiguous tensor for NCCL to work in, and the copy back into the caller's tensor if needed.
struct Staged {
  torch::Tensor buffer;
  std::function<void()> finish;
};

inline Staged stage(torch::Tensor& tensor) {
  if (tensor.is_contiguous()) return {tensor, nullptr};
  torch::Tensor buffer = tensor.contiguous();  // on the current stream, before the ready event
  return {buffer, [tensor, buffer]() mutable { tensor.copy_(buffer); }};
}

}  // namespace gpt2p::comm::nccl
