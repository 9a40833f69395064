#include "ready_queue.h"

namespace commsched {

void ReadyQueue::push(int64_t position) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    heap_.push(position);
  }
  cv_.notify_all();
}

bool ReadyQueue::pop_expected(const std::function<int64_t()>& expected,
                              const std::function<bool()>& stop,
                              std::chrono::steady_clock::time_point deadline, int64_t* position) {
  std::unique_lock<std::mutex> lock(mu_);
  auto head_matches = [&] { return !heap_.empty() && heap_.top() == expected(); };
  cv_.wait_until(lock, deadline, [&] { return stop() || head_matches(); });
  if (!head_matches()) return false;
  *position = heap_.top();
  heap_.pop();
  return true;
}

bool ReadyQueue::try_pop_expected(int64_t expected, int64_t* position) {
  std::lock_guard<std::mutex> lock(mu_);
  if (heap_.empty() || heap_.top() != expected) return false;
  *position = heap_.top();
  heap_.pop();
  return true;
}

void ReadyQueue::wake_all() {
  { std::lock_guard<std::mutex> lock(mu_); }
  cv_.notify_all();
}

void ReadyQueue::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  heap_ = {};
}

}  // namespace commsched
