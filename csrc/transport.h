// The data plane: runs one collective on a flat buffer. The default transport is a
// c10d::ProcessGroup handed over from Python (Gloo on CPU, NCCL on GPU); a world of one needs
// no network at all.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <chrono>
#include <memory>

#include "plan_types.h"

namespace commsched {

class PendingCollective {
 public:
  virtual ~PendingCollective() = default;
  // Blocks until the collective ends; throws on failure or after `timeout`.
  virtual void wait(std::chrono::milliseconds timeout) = 0;
  // Whether the collective has ended (or failed), without blocking. For device tensors that is
  // when the device finished it (NCCL queries its end event; Gloo finished its host part).
  virtual bool done() = 0;
  // Wakes a wait() blocked on a peer and withdraws what is still posted, without blocking (Note
  // [Retiring a group], engine.cpp). Best effort: Gloo can abort its sends and receives, not an
  // all-reduce running on one of its worker threads. A wait() after it throws.
  virtual void abort() {}
};

class Transport {
 public:
  virtual ~Transport() = default;
  // allreduce: in place on `input` (`output` is `input`). reduce_scatter: `input` holds
  // world_size equal shards, `output` receives this rank's reduced shard. all_gather: `input` is
  // this rank's shard, `output` receives every rank's shard in rank order.
  virtual std::unique_ptr<PendingCollective> launch(Collective op, at::Tensor& input,
                                                    at::Tensor& output) = 0;
  virtual int64_t world_size() const = 0;
  virtual int64_t rank() const = 0;
};

class ProcessGroupTransport : public Transport {
 public:
  // `ring` (a Gloo group): run reduce-scatter and all-gather of CPU tensors as the engine's own
  // pipelined rings (Note [Why the engine rings its own reduce-scatter], ring.h) instead of the
  // group's, and device tensors' reduce-scatter as an all-reduce the engine can poll (Note
  // [Gloo's reduce-scatter of device tensors], transport.cpp).
  explicit ProcessGroupTransport(c10::intrusive_ptr<c10d::ProcessGroup> group, bool ring = false);
  std::unique_ptr<PendingCollective> launch(Collective op, at::Tensor& input,
                                            at::Tensor& output) override;
  int64_t world_size() const override;
  int64_t rank() const override;

 private:
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  bool ring_;
  int64_t next_ring_tag_ = 0;  // advanced alike on every rank: the plan's order is the same
};

// Work::abort() where the backend has one (a no-op elsewhere).
void abort_work(c10d::Work& work);

// World size 1: the sum over one rank is the tensor itself.
class LocalTransport : public Transport {
 public:
  std::unique_ptr<PendingCollective> launch(Collective op, at::Tensor& input,
                                            at::Tensor& output) override;
  int64_t world_size() const override { return 1; }
  int64_t rank() const override { return 0; }
};

}  // namespace commsched
