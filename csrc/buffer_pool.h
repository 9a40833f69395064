// Fusion buffers for host gradients, kept for the next iteration's blocks of the same size.
#pragma once

#include <ATen/ATen.h>

#include <mutex>
#include <vector>

namespace commsched {

class BufferPool {
 public:
  // A flat tensor of `numel` elements (contents undefined): on a CPU and from `kMinBytes` up, a
  // view of a kept buffer that no one uses any more, else a new allocation (kept if it is large
  // enough and there is room). Elsewhere (a device: its caching allocator already reuses
  // memory), a new allocation. Thread-safe.
  at::Tensor take(int64_t numel, const at::TensorOptions& options);
  // Forgets every kept buffer (a new plan's blocks have other sizes); one still in use lives on
  // with its users.
  void clear();
  // Bytes of the kept buffers, in use or not, and how many buffers were allocated to be kept.
  int64_t kept_bytes();
  int64_t allocations();

  static constexpr int64_t kMinBytes = 1 << 20;
  static constexpr size_t kMaxKept = 32;

 private:
  std::mutex mu_;
  std::vector<at::Tensor> kept_;
  int64_t allocations_ = 0;
};

}  // namespace commsched
