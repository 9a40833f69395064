// Monotonic timestamps and the event log behind the Chrome-trace timeline and the profiler.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace commsched {

// Microseconds on the steady clock, shared by every thread of the engine.
int64_t now_us();

struct TimelineEvent {
  std::string name;   // "ready:<tensor>", "pack", "allreduce", "unpack"
  char phase;         // 'X' span, 'i' instant
  int64_t ts_us;
  int64_t dur_us;
  int64_t lane;       // 0 compute marks, 1 engine thread, 2 completion thread
  int64_t block_id;   // -1 when not about a block
  int64_t bytes;
  std::string op;
  std::string clock;  // "cpu" or "device_event": where ts_us and dur_us came from
};

class Timeline {
 public:
  void set_enabled(bool enabled);
  bool enabled() const { return enabled_; }
  void span(const std::string& name, int64_t lane, int64_t start_us, int64_t end_us,
            int64_t block_id, int64_t bytes, const std::string& op,
            const std::string& clock = "cpu");
  void instant(const std::string& name, int64_t lane, int64_t ts_us);
  std::vector<TimelineEvent> drain();

 private:
  bool enabled_ = false;
  std::mutex mu_;
  std::vector<TimelineEvent> events_;
};

}  // namespace commsched
