// The NCCL backend's watchdog (comm/watchdog.h) with stand-in operations: it fires once, for the
// oldest unfinished operation past its limit, and never for finished or disarmed ones.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "gpt2p/comm/watchdog.h"

namespace gpt2p::comm {
namespace {

using namespace std::chrono_literals;

struct Fired {
  std::atomic<int> times{0};
  std::atomic<int64_t> age_ms{0};
};

std::unique_ptr<Watchdog> make(Fired& f, std::chrono::milliseconds limit) {
  return std::make_unique<Watchdog>(
      limit,
      [&f](std::chrono::milliseconds age) {
        f.age_ms = age.count();
        ++f.times;
      },
      nullptr, 5ms);
}

void wait_until(const std::function<bool()>& cond, std::chrono::milliseconds at_most) {
  const auto end = std::chrono::steady_clock::now() + at_most;
  while (!cond() && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(2ms);
}

TEST(Watchdog, FinishedOperationsAreDroppedAndNeverFire) {
  Fired f;
  auto w = make(f, 30ms);
  for (int i = 0; i < 5; ++i) w->watch([] { return true; });
  wait_until([&] { return w->pending() == 0; }, 2000ms);
  EXPECT_EQ(w->pending(), 0U);
  std::this_thread::sleep_for(80ms);
  EXPECT_EQ(f.times, 0);
}

TEST(Watchdog, AnOperationPastItsLimitFiresOnceWithItsAge) {
  Fired f;
  auto w = make(f, 40ms);
  w->watch([] { return false; });
  w->watch([] { return false; });
  wait_until([&] { return f.times > 0; }, 2000ms);
  ASSERT_EQ(f.times, 1);
  EXPECT_GE(f.age_ms, 40);
  std::this_thread::sleep_for(80ms);
  EXPECT_EQ(f.times, 1) << "fires once";
}

TEST(Watchdog, AnOperationWithinItsLimitDoesNotFire) {
  Fired f;
  auto w = make(f, 10s);
  std::atomic<bool> done{false};
  w->watch([&] { return done.load(); });
  std::this_thread::sleep_for(60ms);
  EXPECT_EQ(f.times, 0);
  done = true;
  wait_until([&] { return w->pending() == 0; }, 2000ms);
  EXPECT_EQ(w->pending(), 0U);
}

TEST(Watchdog, TheOldestUnfinishedOperationCounts) {
  // Operations finish in order: once the first is done, the second's own age decides.
  Fired f;
  auto w = make(f, 2000ms);
  std::atomic<bool> first{false};
  w->watch([&] { return first.load(); });
  std::this_thread::sleep_for(1000ms);
  w->watch([] { return false; });
  first = true;
  std::this_thread::sleep_for(1300ms);  // the first would be 2300 ms old, the second is 1300
  EXPECT_EQ(f.times, 0);
  wait_until([&] { return f.times > 0; }, 2000ms);
  EXPECT_EQ(f.times, 1);
}

TEST(Watchdog, DisarmedItNeverFires) {
  Fired f;
  auto w = make(f, 20ms);
  w->disarm();
  w->watch([] { return false; });
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(f.times, 0);
}

TEST(Watchdog, DestructionStopsThePollingThreadPromptly) {
  Fired f;
  auto w = std::make_unique<Watchdog>(
      10s, [&f](std::chrono::milliseconds) { ++f.times; }, nullptr, 10s);
  w->watch([] { return false; });
  const auto start = std::chrono::steady_clock::now();
  w.reset();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
  EXPECT_EQ(f.times, 0);
}

}  // namespace
}  // namespace gpt2p::comm
