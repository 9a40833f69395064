// Packs a block's pieces into one flat buffer of the wire dtype and unpacks the reduced result
// back into the gradients. ATen ops only, so the same code runs on CPU and CUDA.
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "buffer_pool.h"
#include "plan_types.h"

namespace commsched {

class FusionBuffer {
 public:
  // Returns the buffer the collective runs on. When the block is one piece of a contiguous
  // gradient of the wire dtype (a whole tensor, or a partition of one), that piece of the
  // gradient itself is returned (no copy), as Horovod does for whole tensors.
  // `padded_numel` >= numel(block): reduce-scatter needs a multiple of the world size; the tail
  // is zero. A new buffer comes from `pool`.
  static at::Tensor pack(const BlockSpec& block, const std::vector<at::Tensor>& grads,
                         int64_t padded_numel, BufferPool& pool);
  // Where a reduce-scatter's paired all-gather writes its `numel` elements: the block's own
  // gradient where the block is zero-copy and needs no padding (Note [An all-gather lands in
  // the gradient it came from]), else a new buffer that unpack() copies out.
  static at::Tensor gather_output(const BlockSpec& block, const std::vector<at::Tensor>& grads,
                                  int64_t numel, const at::TensorOptions& options,
                                  BufferPool& pool);
  // Multiplies the reduced buffer by `scale` and writes each piece back into its gradient
  // (no-op for the zero-copy case apart from the scaling).
  static void unpack(const BlockSpec& block, const at::Tensor& buffer,
                     const std::vector<at::Tensor>& grads, double scale);
  static int64_t numel(const BlockSpec& block);
  // The flat view of the block's one piece in its gradient's memory, where the collective can
  // run there (see pack()); an undefined tensor otherwise.
  static at::Tensor in_place_view(const BlockSpec& block, const std::vector<at::Tensor>& grads);
  static int64_t padded(int64_t numel, int64_t world_size);
};

}  // namespace commsched
