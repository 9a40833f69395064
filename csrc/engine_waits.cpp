// The caller's side of the engine's progress: waiting for blocks (every wait has a deadline:
// COMMSCHED_TIMEOUT), releasing forward-stage blocks, and the first error, which every later
// wait reports.
#include "engine.h"

#include "completion_wait.h"

#include <c10/util/Exception.h>

#include <stdexcept>

namespace commsched {

namespace {

// Marks the caller as waiting from construction to destruction (error or not).
class TimedWait {
 public:
  TimedWait(std::atomic<int64_t>& since, std::atomic<int64_t>& total)
      : since_(since), total_(total), start_(now_us()) {
    since_.store(start_);
  }
  ~TimedWait() {
    total_ += now_us() - start_;
    since_.store(-1);
  }
  TimedWait(const TimedWait&) = delete;
  TimedWait& operator=(const TimedWait&) = delete;

 private:
  std::atomic<int64_t>& since_;
  std::atomic<int64_t>& total_;
  int64_t start_;
};

}  // namespace

void Engine::fail(const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_.empty()) error_ = message;
  }
  done_cv_.notify_all();
}

void Engine::wait_done_locked(std::unique_lock<std::mutex>& lock, int64_t count,
                              int64_t timeout_ms) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  bool finished = done_cv_.wait_until(lock, deadline, [&] {
    return !error_.empty() || completed_ >= count || stopping();
  });
  TORCH_CHECK(error_.empty(), "commsched: ", error_, "\nblocks unfinished:", pending_report());
  TORCH_CHECK(!stopping(), "commsched: engine was shut down while waiting");
  TORCH_CHECK(finished, "commsched: timed out after ", timeout_ms / 1000.0,
              " s (COMMSCHED_TIMEOUT) with ", plan_.size() - completed_, " of ", plan_.size(),
              " blocks unfinished:", pending_report());
}

void Engine::wait_all(int64_t timeout_ms) {
  TimedWait timed(waiting_since_us_, waited_us_);
  std::unique_lock<std::mutex> lock(mu_);
  wait_done_locked(lock, static_cast<int64_t>(plan_.size()), timeout_ms);
  for (const auto& event : done_events_) DeviceSync::current_stream_wait(event);
  last_timings_ = timings_;
  last_ready_us_ = ready_us_;
  // Swapped, not copied: reset_iteration_locked clears what is left in the current ones.
  last_ready_events_.swap(ready_events_);
  if (ready_events_.size() != last_ready_events_.size())
    ready_events_.assign(last_ready_events_.size(), nullptr);
  last_block_events_.swap(block_events_);
  last_clock_ = clock_;
  reset_iteration_locked();
}

void Engine::wait_block(int64_t position, int64_t timeout_ms) {
  TimedWait timed(waiting_since_us_, waited_us_);
  std::unique_lock<std::mutex> lock(mu_);
  TORCH_CHECK(position >= 0 && position < static_cast<int64_t>(plan_.size()),
              "commsched: no block at plan position ", position);
  wait_done_locked(lock, position + 1, timeout_ms);
  for (int64_t pos = 0; pos <= position; ++pos) DeviceSync::current_stream_wait(done_events_[pos]);
}

at::Tensor Engine::reduced_shard(int64_t position) {
  std::lock_guard<std::mutex> lock(mu_);
  TORCH_CHECK(position >= 0 && position < static_cast<int64_t>(plan_.size()) &&
                  plan_[position].op == Collective::kReduceScatter,
              "commsched: no reduce-scatter at plan position ", position);
  TORCH_CHECK(completed_ > position && shards_[position].defined(),
              "commsched: the reduce-scatter at plan position ", position,
              " has not completed (wait_block() it first)");
  return shards_[position];
}

void Engine::release(int64_t position) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    TORCH_CHECK(error_.empty(), "commsched: engine failed earlier: ", error_);
    TORCH_CHECK(position >= 0 && position < static_cast<int64_t>(plan_.size()) &&
                    plan_[position].released_by_caller,
                "commsched: block at position ", position, " is not a forward-stage block");
    TORCH_CHECK(block_pending_[position] == 1, "commsched: block ", plan_[position].block_id,
                " released twice in one iteration");
    block_pending_[position] = 0;
  }
  ready_queue_.push(position);
  if (local_) complete_local();
}

void Engine::wait_on_device(InFlight& item, std::chrono::steady_clock::time_point deadline) {
  // Note [Waiting for device work]: ask, with growing sleeps, instead of NCCL's 1 ms polling.
  if (!wait_with_backoff([&] { return item.collective->done(); }, deadline))
    throw std::runtime_error("the collective had not ended on the device");
  // It has ended (or failed): this raises its error, if any, and orders the current stream (the
  // comm stream) after it, without waiting further.
  item.collective->wait(std::chrono::milliseconds(timeout_ms_));
}

}  // namespace commsched
