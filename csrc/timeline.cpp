#include "timeline.h"

#include <chrono>

namespace commsched {

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void Timeline::set_enabled(bool enabled) { enabled_ = enabled; }

void Timeline::span(const std::string& name, int64_t lane, int64_t start_us, int64_t end_us,
                    int64_t block_id, int64_t bytes, const std::string& op,
                    const std::string& clock) {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back({name, 'X', start_us, end_us - start_us, lane, block_id, bytes, op, clock});
}

void Timeline::instant(const std::string& name, int64_t lane, int64_t ts_us) {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back({name, 'i', ts_us, 0, lane, -1, 0, "", "cpu"});
}

std::vector<TimelineEvent> Timeline::drain() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<TimelineEvent> out;
  out.swap(events_);
  return out;
}

}  // namespace commsched
