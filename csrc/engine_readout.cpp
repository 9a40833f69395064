// What the engine reports after the fact: the last iteration's ready times and block timings
// (read from device events where the tensors live on a device: Note [Which clock] in
// runtime/engine/profiler.py), the timeline's device spans, and, for an error, which blocks are unfinished
// and why.
#include "engine.h"

#include <algorithm>
#include <sstream>

namespace commsched {

namespace {
// Blocks (and missing gradients per block) named in an error before "... and N more".
constexpr size_t kReportLimit = 8;
}  // namespace

// The block's pack, collective and unpack as the device ran them, for the timeline. Waits for the
// unpack to finish: only done while a timeline is written.
void Engine::device_spans(const InFlight& item, const BlockEvents& events,
                          const std::shared_ptr<c10::Event>& done_event,
                          std::chrono::steady_clock::time_point deadline) {
  DeviceClock clock;
  {
    std::lock_guard<std::mutex> lock(mu_);
    clock = clock_;
  }
  const int64_t pack = clock.to_us(events.pack, deadline);
  const int64_t start = clock.to_us(events.start, deadline);
  const int64_t end = clock.to_us(events.end, deadline);
  const int64_t unpacked = clock.to_us(done_event, deadline);
  if (pack < 0 || start < 0 || end < 0 || unpacked < 0) return;  // no anchor, or timed out
  const BlockSpec& block = plan_[item.position];
  const std::string op = collective_name(block.op);
  const char* device = clock_name(Clock::kDeviceEvent);
  timeline_.span("pack", 1, pack, start, block.block_id, item.bytes, op, device);
  timeline_.span(op, 2, start, end, block.block_id, item.bytes, op, device);
  timeline_.span("unpack", 2, end, unpacked, block.block_id, item.bytes, op, device);
}

std::string Engine::pending_report() {
  std::ostringstream out;
  size_t shown = 0;
  for (size_t pos = static_cast<size_t>(completed_); pos < plan_.size() && shown < kReportLimit;
       ++pos, ++shown) {
    const auto& block = plan_[pos];
    out << "\n  block " << block.block_id << " (" << collective_name(block.op) << ", position "
        << pos << "): ";
    if (launched_[pos]) {
      out << "launched, collective not finished (a peer rank may be missing or stalled)";
      continue;
    }
    if (block.released_by_caller && block_pending_[pos] > 0) {
      out << "forward-stage block not released yet";
      continue;
    }
    std::vector<std::string> missing;
    for (const auto& piece : block.pieces)
      if (ready_us_[piece.tensor_id] < 0) missing.push_back(tensor_names_[piece.tensor_id]);
    if (missing.empty()) {
      out << "ready, waiting for earlier blocks";
    } else {
      out << "waiting for gradients of ";
      for (size_t i = 0; i < missing.size() && i < kReportLimit; ++i)
        out << (i ? ", " : "") << "'" << missing[i] << "'";
      if (missing.size() > kReportLimit) out << " and " << missing.size() - kReportLimit << " more";
    }
  }
  if (plan_.size() - static_cast<size_t>(completed_) > shown) out << "\n  ... and " << plan_.size() - completed_ - shown << " more blocks";
  return out.str();
}

std::vector<int64_t> Engine::last_ready_us() {
  std::vector<int64_t> out;
  std::vector<std::shared_ptr<c10::Event>> events;
  DeviceClock clock;
  {
    std::lock_guard<std::mutex> lock(mu_);
    out = last_ready_us_;
    if (!last_clock_.anchored()) return out;
    events = last_ready_events_;
    clock = last_clock_;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms_);
  for (size_t t = 0; t < out.size() && t < events.size(); ++t) {
    if (out[t] < 0 || !events[t]) continue;
    out[t] = clock.to_us(events[t], deadline);
    TORCH_CHECK(out[t] >= 0, "commsched: timed out after ", timeout_ms_ / 1000.0,
                " s (COMMSCHED_TIMEOUT) reading the ready time of '", tensor_names_[t],
                "' from its device event");
  }
  return out;
}

std::vector<BlockTiming> Engine::last_block_timings() {
  std::vector<BlockTiming> out;
  std::vector<BlockEvents> events;
  DeviceClock clock;
  {
    std::lock_guard<std::mutex> lock(mu_);
    out = last_timings_;
    if (!last_clock_.anchored()) return out;
    events = last_block_events_;
    clock = last_clock_;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms_);
  auto read = [&](const std::shared_ptr<c10::Event>& event, int64_t block_id) {
    const int64_t us = clock.to_us(event, deadline);
    TORCH_CHECK(us >= 0, "commsched: timed out after ", timeout_ms_ / 1000.0,
                " s (COMMSCHED_TIMEOUT) reading block ", block_id, "'s device events");
    return us;
  };
  int64_t previous_done = -1;
  for (size_t pos = 0; pos < out.size() && pos < events.size(); ++pos) {
    auto& timing = out[pos];
    const auto& block = events[pos];
    if (block.ready) timing.ready_us = read(block.ready, timing.block_id);
    if (block.start && block.end) {
      timing.launch_us = read(block.start, timing.block_id);
      timing.done_us = read(block.end, timing.block_id);
      timing.service_us = timing.done_us - std::max(timing.launch_us, previous_done);
    }
    previous_done = timing.done_us;
  }
  return out;
}

Clocks Engine::last_clocks() {
  std::lock_guard<std::mutex> lock(mu_);
  const bool device_ready = last_clock_.anchored();
  const bool device_collectives =
      device_ready && std::any_of(last_block_events_.begin(), last_block_events_.end(),
                                  [](const BlockEvents& e) { return e.start && e.end; });
  return Clocks{device_ready ? Clock::kDeviceEvent : Clock::kCpu,
                device_collectives ? Clock::kDeviceEvent : Clock::kCpu};
}

}  // namespace commsched
