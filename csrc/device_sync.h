// Stream/event ordering for accelerator tensors, written against c10's device-generic
// interfaces so the same code serves CUDA (and any other stream device) and compiles everywhere.
// On CPU every call is a no-op. Events are recorded with timing enabled (Note [Device time]).
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <memory>
#include <optional>

namespace commsched {

class DeviceSync {
 public:
  // Records, on the producer's current stream, that `tensor` is complete. Null on CPU.
  static std::shared_ptr<c10::Event> record_ready(const at::Tensor& tensor);
  // The engine's dedicated communication stream for `device` (from the global pool), if any.
  static std::optional<c10::Stream> comm_stream(const c10::Device& device);
  // Makes `stream` wait for `event` (no host blocking).
  static void stream_wait(const c10::Stream& stream, const std::shared_ptr<c10::Event>& event);
  // Tells the caching allocator that `tensor` is used on `stream`, so its memory is not reused
  // before the stream's work on it ends.
  static void record_stream(const at::Tensor& tensor, const c10::Stream& stream);
  // Records an event on `stream` (null on CPU) for the consumer to wait on.
  static std::shared_ptr<c10::Event> record_on(const std::optional<c10::Stream>& stream);
  // Makes the caller's current stream wait for `event`.
  static void current_stream_wait(const std::shared_ptr<c10::Event>& event);
};

}  // namespace commsched
