#include "completion_wait.h"

#include <algorithm>
#include <thread>

namespace commsched {

// Note [Waiting for device work]
// A collective on a device ends when its stream reaches the end of it, which the host learns only
// by asking (cudaEventQuery, Work::isCompleted) or by a blocking synchronize. NCCL's
// Work::wait(timeout) asks once a millisecond, so completions woke up to 1 ms late and CPU-side
// durations came in 1 ms steps. A blocking synchronize (cudaEventSynchronize) wakes on time but
// cannot be given a timeout, and a thread stuck in it could not be joined at shutdown: "every
// wait has a timeout" would then hang on NCCL's watchdog instead of on ours. So the completion
// thread asks, with sleeps that grow with the time already waited: a collective of a few hundred
// microseconds is seen done within ~10-40 us of its end, a long one within an eighth of its
// length and never later than 250 us, and the loop ends at the engine's timeout like every other
// wait. The durations themselves never depend on this wake-up: they are read from events on the
// streams (device_clock.h), so the wake-up lag shows only in when the block's completion is
// noticed, not in the profile.
bool wait_with_backoff(const std::function<bool()>& done,
                       std::chrono::steady_clock::time_point deadline) {
  using std::chrono::microseconds;
  constexpr microseconds kFirst(10);
  constexpr microseconds kLongest(250);
  const auto began = std::chrono::steady_clock::now();
  while (!done()) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return done();
    auto waited = std::chrono::duration_cast<microseconds>(now - began);
    auto pause = std::clamp(waited / 8, kFirst, kLongest);
    auto left = std::chrono::duration_cast<microseconds>(deadline - now);
    std::this_thread::sleep_for(std::min(pause, left));
  }
  return true;
}

}  // namespace commsched
