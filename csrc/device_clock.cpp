#include "device_clock.h"

#include <cmath>

#include "completion_wait.h"

namespace commsched {

// Note [Device time]
// For tensors on a device the host only enqueues work: when a gradient's hook fires, when a
// collective is handed to c10d and when Work reports it done say little about when the device
// produced the gradient or ran the collective. So the engine records timing events (c10::Event
// with EventFlag::BACKEND_DEFAULT, i.e. cudaEventDefault on CUDA) on the streams involved: each
// gradient's ready event on its producer's stream, and on the engine's comm stream one before
// the pack, one before the collective is launched, one after it ends (after Work::wait has
// ordered the comm stream behind it) and one after the unpack. Differences between events of one
// device are exact (cudaEventElapsedTime, ~0.5 us resolution), whatever the streams. To put them
// on the same axis as the CPU figures (the timeline; "ready" relative to the first gradient),
// each iteration takes its first ready event as the anchor and maps an event to the anchor's host
// time plus the device time since the anchor. The offset of that axis is the device's lag behind
// the host at the first gradient (unknown, and the same for every figure of the iteration);
// every difference the profiler uses (ready times relative to the first, a collective's service
// time) is device-exact. Events are read lazily, when a figure is asked for, so the training
// thread does not wait on the device for figures nobody reads.

const char* clock_name(Clock clock) { return clock == Clock::kCpu ? "cpu" : "device_event"; }

void DeviceClock::anchor(const std::shared_ptr<c10::Event>& event, int64_t host_us) {
  if (!event || anchor_) return;
  anchor_ = event;
  anchor_host_us_ = host_us;
}

void DeviceClock::reset() {
  anchor_.reset();
  anchor_host_us_ = -1;
}

int64_t DeviceClock::to_us(const std::shared_ptr<c10::Event>& event,
                           std::chrono::steady_clock::time_point deadline) const {
  if (!event || !anchor_) return -1;
  if (!event_done_by(*anchor_, deadline) || !event_done_by(*event, deadline)) return -1;
  const double ms = anchor_->elapsedTime(*event);
  return anchor_host_us_ + static_cast<int64_t>(std::llround(ms * 1000.0));
}

bool event_done_by(const c10::Event& event, std::chrono::steady_clock::time_point deadline) {
  return wait_with_backoff([&] { return event.query(); }, deadline);
}

}  // namespace commsched
