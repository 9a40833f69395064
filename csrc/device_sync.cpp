#include "device_sync.h"

#include <c10/core/impl/VirtualGuardImpl.h>

#include <map>
#include <mutex>

namespace commsched {

namespace {
bool is_stream_device(const c10::Device& device) { return device.type() != c10::kCPU; }

// With timing enabled, so that durations can be read off them (Note [Device time]).
std::shared_ptr<c10::Event> timed_event(c10::DeviceType type) {
  return std::make_shared<c10::Event>(type, c10::EventFlag::BACKEND_DEFAULT);
}
}  // namespace

std::shared_ptr<c10::Event> DeviceSync::record_ready(const at::Tensor& tensor) {
  if (!is_stream_device(tensor.device())) return nullptr;
  c10::impl::VirtualGuardImpl impl(tensor.device().type());
  auto event = timed_event(tensor.device().type());
  event->record(impl.getStream(tensor.device()));
  return event;
}

std::optional<c10::Stream> DeviceSync::comm_stream(const c10::Device& device) {
  if (!is_stream_device(device)) return std::nullopt;
  static std::mutex mu;
  static std::map<std::pair<int, int>, c10::Stream> streams;
  std::lock_guard<std::mutex> lock(mu);
  auto key = std::make_pair(static_cast<int>(device.type()), static_cast<int>(device.index()));
  auto it = streams.find(key);
  if (it == streams.end()) {
    c10::impl::VirtualGuardImpl impl(device.type());
    it = streams.emplace(key, impl.getStreamFromGlobalPool(device, /*isHighPriority=*/true)).first;
  }
  return it->second;
}

void DeviceSync::stream_wait(const c10::Stream& stream, const std::shared_ptr<c10::Event>& event) {
  if (event) event->block(stream);
}

void DeviceSync::record_stream(const at::Tensor& tensor, const c10::Stream& stream) {
  if (!is_stream_device(tensor.device())) return;
  c10::impl::VirtualGuardImpl impl(tensor.device().type());
  impl.recordDataPtrOnStream(tensor.storage().data_ptr(), stream);
}

std::shared_ptr<c10::Event> DeviceSync::record_on(const std::optional<c10::Stream>& stream) {
  if (!stream) return nullptr;
  auto event = timed_event(stream->device_type());
  event->record(*stream);
  return event;
}

void DeviceSync::current_stream_wait(const std::shared_ptr<c10::Event>& event) {
  if (!event) return;
  c10::impl::VirtualGuardImpl impl(event->device_type());
  event->block(impl.getStream(c10::Device(event->device_type(), event->device_index())));
}

}  // namespace commsched
