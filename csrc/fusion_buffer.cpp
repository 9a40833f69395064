#include "fusion_buffer.h"

#include <c10/util/Exception.h>

namespace commsched {

namespace {
at::Tensor piece_view(const at::Tensor& grad, const PieceSpec& piece) {
  if (piece.offset == 0 && piece.numel == grad.numel()) return grad;
  TORCH_CHECK(grad.is_contiguous(), "commsched: a partitioned gradient must be contiguous (tensor ",
              piece.tensor_id, ")");
  return grad.view(-1).narrow(0, piece.offset, piece.numel);
}
}  // namespace

int64_t FusionBuffer::numel(const BlockSpec& block) {
  int64_t total = 0;
  for (const auto& piece : block.pieces) total += piece.numel;
  return total;
}

// Note [A partition is reduced in place]
// ByteScheduler and Prophet cut a large gradient into partitions, each a block of one piece: a
// contiguous run of the flattened gradient. The collective runs on that run of the gradient's
// own memory, as on a whole tensor; before, each partition was copied into a buffer of its own
// and back, which on a CPU moved every partitioned byte twice more per iteration on the cores
// that compute. Partitions of one gradient are disjoint, so several may be in flight at once.
at::Tensor FusionBuffer::in_place_view(const BlockSpec& block,
                                       const std::vector<at::Tensor>& grads) {
  if (block.pieces.size() != 1) return at::Tensor();
  const auto& piece = block.pieces[0];
  const auto& grad = grads[piece.tensor_id];
  if (!grad.is_contiguous() || grad.scalar_type() != block.wire_dtype) return at::Tensor();
  return piece_view(grad, piece).view(-1);
}

int64_t FusionBuffer::padded(int64_t numel, int64_t world_size) {
  return (numel + world_size - 1) / world_size * world_size;
}

at::Tensor FusionBuffer::pack(const BlockSpec& block, const std::vector<at::Tensor>& grads,
                              int64_t padded_numel, BufferPool& pool) {
  TORCH_INTERNAL_ASSERT(!block.pieces.empty(), "block ", block.block_id, " has no pieces");
  const int64_t total = numel(block);
  TORCH_INTERNAL_ASSERT(padded_numel >= total, "padding shorter than the block");
  at::Tensor buffer;
  if (padded_numel == total) buffer = in_place_view(block, grads);
  if (!buffer.defined()) {
    const auto& first = grads[block.pieces[0].tensor_id];
    buffer = pool.take(padded_numel, first.options().dtype(block.wire_dtype));
    if (padded_numel > total) buffer.narrow(0, total, padded_numel - total).zero_();
    int64_t pos = 0;
    for (const auto& piece : block.pieces) {
      const auto& grad = grads[piece.tensor_id];
      TORCH_INTERNAL_ASSERT(grad.defined(), "gradient ", piece.tensor_id, " missing at pack");
      buffer.narrow(0, pos, piece.numel).view(piece_view(grad, piece).sizes())
          .copy_(piece_view(grad, piece));
      pos += piece.numel;
    }
  }
  if (block.prescale != 1.0) buffer.mul_(block.prescale);
  return buffer;
}

// Note [An all-gather lands in the gradient it came from]
// A DeAR pair reduce-scatters a block and all-gathers the averaged result into the same
// gradients. Where the block is one whole gradient (every gradient above the fusion threshold,
// so most of the bytes), the reduce-scatter already read it in place, and the all-gather
// launches only once that reduce-scatter has completed: nothing reads the gradient's memory any
// more (step() took it out of p.grad, the engine owns it). So the all-gather writes straight
// into it. A new output buffer would cost, on a CPU, the page faults of a fresh allocation
// while the ring copies this rank's shard in, then a copy of the whole block back into the
// gradient on the completion thread, ahead of every later block's completion: on VGG-16's
// 411 MB classifier weight both sat on the path of the next forward pass
// (benchmarks/real/vgg16/dear_timeline.md). The pair's averaging is applied to this rank's
// shard before it is sent (engine.cpp): half the elements, the same products.
at::Tensor FusionBuffer::gather_output(const BlockSpec& block, const std::vector<at::Tensor>& grads,
                                       int64_t numel, const at::TensorOptions& options,
                                       BufferPool& pool) {
  if (numel == FusionBuffer::numel(block)) {
    auto view = in_place_view(block, grads);
    if (view.defined()) return view;
  }
  return pool.take(numel, options);
}

void FusionBuffer::unpack(const BlockSpec& block, const at::Tensor& buffer,
                          const std::vector<at::Tensor>& grads, double scale) {
  if (scale != 1.0) buffer.mul_(scale);
  const auto view = in_place_view(block, grads);
  if (view.defined() && buffer.data_ptr() == view.data_ptr()) return;
  int64_t pos = 0;
  for (const auto& piece : block.pieces) {
    auto target = piece_view(grads[piece.tensor_id], piece);
    target.copy_(buffer.narrow(0, pos, piece.numel).view(target.sizes()));
    pos += piece.numel;
  }
}

}  // namespace commsched
