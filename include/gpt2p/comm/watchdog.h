// A thread that watches operations which complete in order (one CUDA stream's NCCL calls) and
// fires once when the oldest unfinished one has waited longer than its limit.
//
// The NCCL backend needs it because a rank does not only wait in calls it can time: a loss read
// with item() or a copy to the host queues behind NCCL's kernels, and with a peer stopped or dead
// those kernels never end. c10d's watchdog does the same job. Torch-free: the caller says how to
// ask whether an operation is done (cudaEventQuery) and what firing does (abort the communicator,
// end the job).
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace gpt2p::comm {

class Watchdog {
 public:
  // True once the operation has completed; called on the watchdog's thread, in watch() order.
  using Done = std::function<bool()>;
  // Called at most once, on the watchdog's thread, with the oldest unfinished operation's age.
  using OnTimeout = std::function<void(std::chrono::milliseconds age)>;

  // `on_start` runs first on the watchdog's thread (cudaSetDevice). Polls every `poll`.
  Watchdog(std::chrono::milliseconds limit, OnTimeout on_timeout,
           std::function<void()> on_start = {},
           std::chrono::milliseconds poll = std::chrono::milliseconds(100));
  // Stops and joins the thread (on_timeout must not destroy its own watchdog).
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // An operation enqueued now.
  void watch(Done done);
  // Never fire from now on (the owner reported a failure itself).
  void disarm();
  // Operations watched and not yet seen done (for tests).
  size_t pending();

 private:
  void loop(const std::function<void()>& on_start);

  struct Op {
    Done done;
    std::chrono::steady_clock::time_point since;
  };
  const std::chrono::milliseconds limit_, poll_;
  OnTimeout on_timeout_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Op> ops_;
  bool stopping_ = false, disarmed_ = false;
  std::thread thread_;
};

}  // namespace gpt2p::comm
