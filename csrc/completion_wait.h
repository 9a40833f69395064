// Waiting for device work without a blocking call that cannot time out (Note [Waiting for device
// work]).
#pragma once

#include <chrono>
#include <functional>

namespace commsched {

// Calls `done` until it returns true or `deadline` passes, sleeping between calls for a span that
// grows with the time already waited (10 us at first, an eighth of the wait so far, 250 us at
// most). Returns whether `done` returned true.
bool wait_with_backoff(const std::function<bool()>& done,
                       std::chrono::steady_clock::time_point deadline);

}  // namespace commsched
