// Blocks whose pieces are all ready, keyed by plan position. The engine pops strictly in plan
// order (c10d needs the same collective order on every rank): a late block delays, never reorders.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <queue>
#include <vector>

namespace commsched {

class ReadyQueue {
 public:
  void push(int64_t position);
  // Waits until the head of the queue is `expected()`, `stop()` returns true, or the deadline
  // passes. Returns true and removes the head (stored in `position`) when it matched.
  bool pop_expected(const std::function<int64_t()>& expected, const std::function<bool()>& stop,
                    std::chrono::steady_clock::time_point deadline, int64_t* position);
  // Removes the head and stores it in `position` if it is `expected`; never waits.
  bool try_pop_expected(int64_t expected, int64_t* position);
  void wake_all();
  void clear();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::priority_queue<int64_t, std::vector<int64_t>, std::greater<int64_t>> heap_;
};

}  // namespace commsched
