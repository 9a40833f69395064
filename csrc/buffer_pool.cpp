#include "buffer_pool.h"

namespace commsched {

// Note [Host fusion buffers are kept]
// On a CPU a block that is not reduced in place is copied into a new buffer, and a fused
// all-gather lands in one. glibc serves an allocation above its mmap threshold (at most 32 MiB)
// with fresh pages and unmaps them on free, so each such buffer was page-faulted again every
// iteration, on the engine thread, on cores the backward pass needs: on GPT-2 under `dear` at
// 64 MiB the large blocks packed several times slower than fused blocks small enough to be
// reused from the heap (figures: benchmarks/notes/README.md, 'Host fusion buffers are kept').
// Horovod keeps a persistent fusion buffer for the same reason. Here a buffer is kept once it
// is allocated and handed out again, as a view, when its storage has no other user: every
// tensor that shares it (the engine's in-flight record, the transport's work, a shard Python
// still holds) counts, so nothing in use is given out twice. A buffer up to a quarter larger
// than asked for fits, so blocks of nearly equal sizes share buffers. A new plan forgets them
// (install_plan). A device's caching allocator already reuses memory; there nothing is kept.
at::Tensor BufferPool::take(int64_t numel, const at::TensorOptions& options) {
  const int64_t bytes = numel * static_cast<int64_t>(c10::elementSize(c10::typeMetaToScalarType(
                                    options.dtype())));
  if (!options.device().is_cpu() || bytes < kMinBytes) return at::empty({numel}, options);
  std::lock_guard<std::mutex> lock(mu_);
  const at::Tensor* best = nullptr;
  for (const auto& buffer : kept_) {
    const int64_t size = buffer.numel();
    if (buffer.dtype() != options.dtype() || size < numel || size > numel + numel / 4) continue;
    if (buffer.storage().use_count() != 1) continue;  // still in use
    if (best == nullptr || size < best->numel()) best = &buffer;
  }
  if (best != nullptr) return best->narrow(0, 0, numel);
  auto buffer = at::empty({numel}, options);
  if (kept_.size() < kMaxKept) {
    kept_.push_back(buffer);
    allocations_ += 1;
    return buffer.narrow(0, 0, numel);  // a second user of the storage while it is out
  }
  return buffer;
}

void BufferPool::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  kept_.clear();
}

int64_t BufferPool::allocations() {
  std::lock_guard<std::mutex> lock(mu_);
  return allocations_;
}

int64_t BufferPool::kept_bytes() {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t total = 0;
  for (const auto& buffer : kept_) total += buffer.nbytes();
  return total;
}

}  // namespace commsched
