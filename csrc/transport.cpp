#include "transport.h"

#include <c10/util/Exception.h>

#include "ring.h"
#include "torch_compat.h"

namespace commsched {

namespace {
c10::intrusive_ptr<c10d::Work> allreduce_sum(c10d::ProcessGroup& group,
                                             const at::Tensor& tensor) {
  std::vector<at::Tensor> tensors{tensor};
  c10d::AllreduceOptions options;
  options.reduceOp = c10d::ReduceOp::SUM;
  return group.allreduce(tensors, options);
}

}  // namespace

void abort_work(c10d::Work& work) {
  try {
    work.abort();  // Gloo's send and receive; c10d::Work's own throws "not implemented"
  } catch (const std::exception&) {
  }
}

namespace {

class WorkCollective : public PendingCollective {
 public:
  explicit WorkCollective(c10::intrusive_ptr<c10d::Work> work) : work_(std::move(work)) {}
  void wait(std::chrono::milliseconds timeout) override {
    work_->wait(timeout);
  }
  bool done() override { return work_->isCompleted(); }
  void abort() override { abort_work(*work_); }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
};

// Note [Gloo's reduce-scatter of device tensors]
// Gloo reduces-scatters a device tensor by cloning it, all-reducing the clone and copying this
// rank's shard out inside Work::wait(); the Work it returns never reports itself completed, so
// an engine that asks done() of device collectives (Note [Waiting for device work]) would wait
// until its timeout. On a Gloo group the transport therefore does the same thing itself: the
// all-reduce's Work answers done(), and wait() copies the shard on the caller's current stream
// (the engine's comm stream, which also allocated the clone, so freeing it after the copy is
// queued is safe). The bytes on the wire are those of Gloo's own path.
class ShardOfAllreduce : public PendingCollective {
 public:
  ShardOfAllreduce(c10::intrusive_ptr<c10d::ProcessGroup>& group, const at::Tensor& input,
                   at::Tensor output)
      : buffer_(input.clone()), output_(std::move(output)), group_size_(group->getSize()),
        rank_(group->getRank()), work_(allreduce_sum(*group, buffer_)) {}
  void wait(std::chrono::milliseconds timeout) override {
    work_->wait(timeout);
    output_.copy_(buffer_.chunk(group_size_)[rank_]);
  }
  bool done() override { return work_->isCompleted(); }
  void abort() override { abort_work(*work_); }

 private:
  at::Tensor buffer_;
  at::Tensor output_;
  int64_t group_size_;
  int64_t rank_;
  c10::intrusive_ptr<c10d::Work> work_;
};

class DoneCollective : public PendingCollective {
 public:
  void wait(std::chrono::milliseconds) override {}
  bool done() override { return true; }
};
}  // namespace

ProcessGroupTransport::ProcessGroupTransport(c10::intrusive_ptr<c10d::ProcessGroup> group,
                                             bool ring)
    : group_(std::move(group)), ring_(ring) {
  TORCH_CHECK(group_, "commsched: ProcessGroupTransport needs a process group");
}

std::unique_ptr<PendingCollective> ProcessGroupTransport::launch(Collective op, at::Tensor& input,
                                                                 at::Tensor& output) {
  if (ring_ && op != Collective::kAllreduce && input.is_cpu()) {
    const int64_t shard = op == Collective::kReduceScatter ? output.numel() : input.numel();
    const int64_t base = next_ring_tag_;
    // Tags stay non-negative ints; a wrapped-around tag belongs to a ring long finished.
    next_ring_tag_ = (base + ring_tags(group_->getSize(), shard, input.element_size())) % (1 << 30);
    return launch_ring(group_, op, input, output, base);
  }
  if (ring_ && op == Collective::kReduceScatter)
    return std::make_unique<ShardOfAllreduce>(group_, input, output);
  switch (op) {
    case Collective::kAllreduce:
      return std::make_unique<WorkCollective>(allreduce_sum(*group_, input));
    case Collective::kReduceScatter: {
      c10d::ReduceScatterOptions options;
      options.reduceOp = c10d::ReduceOp::SUM;
      return std::make_unique<WorkCollective>(
          torch_compat::reduce_scatter_single(*group_, output, input, options));
    }
    case Collective::kAllGather:
      return std::make_unique<WorkCollective>(
          torch_compat::all_gather_single(*group_, output, input));
  }
  TORCH_INTERNAL_ASSERT(false, "unknown collective");
}

int64_t ProcessGroupTransport::world_size() const { return group_->getSize(); }

int64_t ProcessGroupTransport::rank() const { return group_->getRank(); }

std::unique_ptr<PendingCollective> LocalTransport::launch(Collective op, at::Tensor& input,
                                                          at::Tensor& output) {
  if (op != Collective::kAllreduce) output.copy_(input);
  return std::make_unique<DoneCollective>();
}

}  // namespace commsched
