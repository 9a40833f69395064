// Reduce-scatter and all-gather as pipelined rings over point-to-point on the engine's own group.
//
// Note [Why the engine rings its own reduce-scatter]
// DeAR's premise is that a reduce-scatter plus an all-gather cost one all-reduce: each moves
// (p-1)/p of the buffer. Gloo's reduce_scatter does not (measured in
// benchmarks/collectives/: on 2 ranks it costs about as much as a whole all-reduce), so on
// Gloo the engine runs both as rings of send/recv instead:
//   * the buffer's p shards travel p-1 steps round the ring; rank r sends at step s the shard it
//     received (and, for a reduce-scatter, added its own part to) at step s-1;
//   * each shard is cut into chunks of at most kRingChunkBytes, and a chunk moves on as soon as
//     it arrived (and was reduced), so the reduction of one chunk overlaps the next one's
//     transfer and successive steps overlap each other;
//   * every receive is posted at launch (Gloo moves data once both sides are posted), and each
//     (step, chunk) message has its own tag, so no two messages of one ring can be confused;
//     the tags of successive rings follow a per-transport counter that every rank advances
//     alike, because every rank launches the same plan in the same order;
//   * the input is never written: a reduce-scatter accumulates in its receive buffers (the
//     input may be a user's gradient, zero-copy). The sum of shard c is formed in a fixed
//     order, starting at rank c+1 and ending at rank c, and only rank c holds it; the
//     all-gather hands those very bytes to everyone, so every rank ends bit-identical.
// NCCL's collectives already cost what the ring algorithm says; the ring is for CPU tensors.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <memory>

#include "plan_types.h"
#include "transport.h"

namespace commsched {

constexpr int64_t kRingChunkBytes = 1 << 20;

// Launches a ring reduce-scatter (input: world equal shards, output: this rank's reduced shard)
// or all-gather (input: this rank's shard, output: every shard in rank order) on `group`.
// `tag_base` must be the same on every rank and leave room for ring_tags(...) tags. The
// returned collective completes the ring when waited on.
std::unique_ptr<PendingCollective> launch_ring(const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                                               Collective op, const at::Tensor& input,
                                               const at::Tensor& output, int64_t tag_base);

// Tags one ring with shards of `shard_numel` elements uses on a group of `world` ranks.
int64_t ring_tags(int64_t world, int64_t shard_numel, int64_t element_size);

}  // namespace commsched
