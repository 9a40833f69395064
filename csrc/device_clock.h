// Times of device work, read from timing events on the streams involved (Note [Device time]).
#pragma once

#include <c10/core/Event.h>

#include <chrono>
#include <cstdint>
#include <memory>

namespace commsched {

// Which clock a figure came from; the profile and the timeline carry the name.
enum class Clock { kCpu, kDeviceEvent };
const char* clock_name(Clock clock);

class DeviceClock {
 public:
  // Takes `event` (recorded when the host was at `host_us`) as the iteration's origin, unless one
  // is set already. Null events are ignored.
  void anchor(const std::shared_ptr<c10::Event>& event, int64_t host_us);
  bool anchored() const { return anchor_ != nullptr; }
  void reset();
  // `event`'s time on the steady-clock axis (us): the anchor's host time plus the device time
  // from the anchor to `event`. Waits until `deadline` for both events to complete; -1 if they
  // have not by then, or if `event` is null or there is no anchor.
  int64_t to_us(const std::shared_ptr<c10::Event>& event,
                std::chrono::steady_clock::time_point deadline) const;

 private:
  std::shared_ptr<c10::Event> anchor_;
  int64_t anchor_host_us_ = -1;
};

// Waits (Note [Waiting for device work]) until `event` has completed or `deadline` passes.
bool event_done_by(const c10::Event& event, std::chrono::steady_clock::time_point deadline);

}  // namespace commsched
