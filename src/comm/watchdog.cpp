#include "gpt2p/comm/watchdog.h"

#include <utility>

namespace gpt2p::comm {

Watchdog::Watchdog(std::chrono::milliseconds limit, OnTimeout on_timeout,
                   std::function<void()> on_start, std::chrono::milliseconds poll)
    : limit_(limit), poll_(poll), on_timeout_(std::move(on_timeout)) {
  thread_ = std::thread([this, start = std::move(on_start)] { loop(start); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (!thread_.joinable()) return;
  thread_.join();  // on_timeout never destroys its own watchdog
}

void Watchdog::watch(Done done) {
  std::lock_guard<std::mutex> lock(mutex_);
  ops_.push_back({std::move(done), std::chrono::steady_clock::now()});
}

void Watchdog::disarm() {
  std::lock_guard<std::mutex> lock(mutex_);
  disarmed_ = true;
}

size_t Watchdog::pending() {
  std::lock_guard<std::mutex> lock(mutex_);
  return ops_.size();
}

void Watchdog::loop(const std::function<void()>& on_start) {
  if (on_start) on_start();
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    wake_.wait_for(lock, poll_);
    if (stopping_ || disarmed_) continue;
    // In order: the first unfinished operation is the oldest one that can be late. Each is asked
    // without the lock (cudaEventQuery may wait on a driver lock), so watch() never blocks.
    bool front_done = true;
    while (!ops_.empty() && front_done) {
      const Done done = ops_.front().done;
      lock.unlock();
      front_done = done();
      lock.lock();
      if (front_done && !ops_.empty()) ops_.pop_front();
    }
    if (stopping_ || disarmed_ || ops_.empty()) continue;
    const auto age = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - ops_.front().since);
    if (age <= limit_) continue;
    disarmed_ = true;  // once
    lock.unlock();
    on_timeout_(age);
    lock.lock();
  }
}

}  // namespace gpt2p::comm
