// Private to the NCCL backend (src/comm/nccl_communicator.cpp, compiled only with CUDA): the
// handles its calls return. A Work owns the event recorded after its NCCL calls on the
// communicator's stream and keeps the communicator (NcclState) alive while it may still be
// waited on.
#pragma once

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <nccl.h>

#include <atomic>
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
#include "gpt2p/comm/watchdog.h"
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
//
// Its watchdog (comm/watchdog.h) ends the job when an operation is not done `timeout` +
// kWatchdogGrace after it was enqueued. Work::synchronize() times its own waits, but a rank also
// blocks in plain CUDA synchronisations that queue behind NCCL's kernels (a loss read with item(),
// a copy to the host); with a peer stopped or dead those would wait forever. The watchdog then
// reports through gpt2p::fatal (one error line, MPI_Abort), which ends every process and with it
// the communicator: it does not call ncclCommAbort itself, which could free the communicator
// under a call of the main thread (and may itself hang). Where synchronize() is the one waiting,
// it reports first (its limit is the timeout) and aborts the communicator on its own thread.
struct NcclState {
  static constexpr std::chrono::milliseconds kWatchdogGrace{2000};

  ncclComm_t comm = nullptr;
  int device = 0;
  std::chrono::milliseconds timeout{60000};
  std::atomic<bool> aborted{false};
  std::unique_ptr<Watchdog> watchdog;

  NcclState() = default;
  NcclState(const NcclState&) = delete;
  NcclState& operator=(const NcclState&) = delete;

  ~NcclState() {
    watchdog.reset();  // joins its thread before the communicator goes
    if (comm != nullptr && !aborted.load()) {
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

  // Once: the first caller aborts the communicator; true for that caller.
  bool abort_once() {
    if (aborted.exchange(true)) return false;
    if (watchdog) watchdog->disarm();
    ncclCommAbort(comm);
    return true;
  }

  [[noreturn]] void abort_and_throw(const std::string& what, const char* file, int line) {
    abort_once();
    ::gpt2p::detail::throw_error(what + " (the NCCL communicator was aborted)", kAbortHint, file,
                                 line);
  }

  // After comm is initialised.
  void start_watchdog() {
    watchdog = std::make_unique<Watchdog>(
        timeout + kWatchdogGrace,
        [this](std::chrono::milliseconds age) {
          // The program's own wait got there first, aborted and reports.
          if (aborted.exchange(true)) return;
          fatal(Error("an NCCL operation enqueued " + std::to_string(age.count()) +
                          " ms ago is not done, past --comm-timeout (" +
                          std::to_string(timeout.count()) +
                          " ms): the job is ended without waiting for the NCCL communicator",
                      kAbortHint, __FILE__, __LINE__));
        },
        [dev = device] {
          cudaSetDevice(dev);
          // The trainer may be capturing a CUDA graph on its own thread meanwhile
          // (compat/cuda_graph.h): in CUDA's default (global) capture mode this thread's
          // cudaEventQuery would invalidate that capture. Relaxed: this thread's calls never do.
          cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
          cudaThreadExchangeStreamCaptureMode(&mode);
        });
  }

  // An enqueued operation, by the event recorded after it.
  void watch(std::shared_ptr<Event> done) {
    watchdog->watch([done = std::move(done)] {
      const cudaError_t rc = cudaEventQuery(done->get());
      // Not ready, or (a capture elsewhere refused the query) not known yet: not an error.
      const bool pending = rc == cudaErrorNotReady || rc == cudaErrorStreamCaptureUnsupported ||
                           rc == cudaErrorStreamCaptureInvalidated;
      if (pending) (void)cudaGetLastError();
      return !pending;
    });
  }

 private:
  static constexpr const char* kAbortHint =
      "a peer rank has probably died, stopped or diverged (made different calls); look at the "
      "other ranks' errors, rerun with NCCL_DEBUG=WARN, or raise --comm-timeout if the step is "
      "legitimately slow";
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
