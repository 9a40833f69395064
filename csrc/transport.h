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
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual std::unique_ptr<PendingCollective> launch(Collective op, at::Tensor& buffer) = 0;
  virtual int64_t world_size() const = 0;
};

class ProcessGroupTransport : public Transport {
 public:
  explicit ProcessGroupTransport(c10::intrusive_ptr<c10d::ProcessGroup> group);
  std::unique_ptr<PendingCollective> launch(Collective op, at::Tensor& buffer) override;
  int64_t world_size() const override;

 private:
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
};

// World size 1: the sum over one rank is the tensor itself.
class LocalTransport : public Transport {
 public:
  std::unique_ptr<PendingCollective> launch(Collective op, at::Tensor& buffer) override;
  int64_t world_size() const override { return 1; }
};

}  // namespace commsched
