#include "ring.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "transport.h"

namespace commsched {

namespace {

using Clock = std::chrono::steady_clock;

int64_t chunks_per_shard(int64_t shard_numel, int64_t element_size) {
  const int64_t per_chunk = std::max<int64_t>(1, kRingChunkBytes / element_size);
  return std::max<int64_t>(1, (shard_numel + per_chunk - 1) / per_chunk);
}

// One ring in flight: its messages, the buffers they read and write, and the steps still to
// go. wait() drives it to the end (see Note [Why the engine rings its own reduce-scatter]).
class RingCollective : public PendingCollective {
 public:
  RingCollective(c10::intrusive_ptr<c10d::ProcessGroup> group, Collective op, at::Tensor input,
                 at::Tensor output, int64_t tag_base)
      : group_(std::move(group)), op_(op), input_(std::move(input)), output_(std::move(output)),
        tag_base_(tag_base) {
    world_ = group_->getSize();
    rank_ = group_->getRank();
    shard_ = op_ == Collective::kReduceScatter ? input_.numel() / world_ : input_.numel();
    chunks_ = chunks_per_shard(shard_, input_.element_size());
    per_chunk_ = (shard_ + chunks_ - 1) / chunks_;
    if (world_ == 1) {  // nothing to exchange: the one shard is the result
      output_.copy_(input_);
      finished_ = true;
      return;
    }
    post_receives();
    post_first_sends();
  }

  void wait(std::chrono::milliseconds timeout) override {
    const auto deadline = Clock::now() + timeout;
    for (int64_t step = 0; step + 1 < world_; ++step) {
      for (int64_t k = 0; k < chunks_; ++k) {
        wait_work(posted(recvs_, step * chunks_ + k), deadline);
        if (op_ == Collective::kReduceScatter)
          chunk(received(step), k).add_(chunk(shard_of(input_, ring_index(step)), k));
        if (step + 2 < world_) send(chunk(forwarded(step), k), step + 1, k);
      }
    }
    std::vector<c10::intrusive_ptr<c10d::Work>> sends;
    {
      std::lock_guard<std::mutex> lock(mu_);
      sends = sends_;  // complete: only this thread posts sends, inside this wait()
    }
    for (auto& work : sends) wait_work(work, deadline);
    finished_ = true;
  }

  // Called from the retiring engine's caller while wait() may run on the completion thread.
  void abort() override {
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    {
      std::lock_guard<std::mutex> lock(mu_);
      aborted_ = true;
      works = recvs_;
      works.insert(works.end(), sends_.begin(), sends_.end());
    }
    for (auto& work : works) abort_work(*work);
  }

  // The ring moves on only inside wait(), so it is done once a wait() has returned. The engine
  // asks done() only of device tensors' collectives, and the ring carries CPU tensors only.
  bool done() override { return finished_; }

 private:
  // The shard rank r receives at step s (and, for a reduce-scatter, reduces): r - s - 2 for a
  // reduce-scatter (it ends with its own shard r), r - s - 1 for an all-gather.
  int64_t ring_index(int64_t step) const {
    const int64_t back = op_ == Collective::kReduceScatter ? step + 2 : step + 1;
    return ((rank_ - back) % world_ + world_) % world_;
  }

  at::Tensor shard_of(const at::Tensor& flat, int64_t index) const {
    return flat.narrow(0, index * shard_, shard_);
  }

  at::Tensor chunk(const at::Tensor& shard, int64_t k) const {
    const int64_t begin = k * per_chunk_;
    return shard.narrow(0, begin, std::min(per_chunk_, shard_ - begin));
  }

  // Where step s's message lands. A reduce-scatter's last step lands in the output itself.
  at::Tensor received(int64_t step) const {
    if (op_ == Collective::kAllGather) return shard_of(output_, ring_index(step));
    return step + 2 == world_ ? output_ : accumulators_[step];
  }

  // What goes on at step s + 1: the shard just received (and reduced).
  at::Tensor forwarded(int64_t step) const { return received(step); }

  int tag(int64_t step, int64_t k) const {
    return static_cast<int>(tag_base_ + step * chunks_ + k);
  }

  void post_receives() {
    const int prev = static_cast<int>((rank_ + world_ - 1) % world_);
    if (op_ == Collective::kReduceScatter) {
      for (int64_t step = 0; step + 2 < world_; ++step)
        accumulators_.push_back(at::empty({shard_}, input_.options()));
    }
    for (int64_t step = 0; step + 1 < world_; ++step) {
      for (int64_t k = 0; k < chunks_; ++k) {
        std::vector<at::Tensor> target{chunk(received(step), k)};
        recvs_.push_back(group_->recv(target, prev, tag(step, k)));
      }
    }
  }

  void post_first_sends() {
    // A reduce-scatter starts with the raw shard r - 1 (its sum ends at rank r - 1); an
    // all-gather with this rank's own shard, which it also places in its output.
    at::Tensor first = input_;
    if (op_ == Collective::kReduceScatter) {
      first = shard_of(input_, (rank_ + world_ - 1) % world_);
    } else {
      shard_of(output_, rank_).copy_(input_);
    }
    for (int64_t k = 0; k < chunks_; ++k) send(chunk(first, k), 0, k);
  }

  c10::intrusive_ptr<c10d::Work> posted(const std::vector<c10::intrusive_ptr<c10d::Work>>& works,
                                        size_t i) {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_) throw std::runtime_error("commsched: ring aborted (its group is retired)");
    return works[i];
  }

  void send(const at::Tensor& data, int64_t step, int64_t k) {
    std::vector<at::Tensor> payload{data};
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_) throw std::runtime_error("commsched: ring aborted (its group is retired)");
    sends_.push_back(group_->send(payload, static_cast<int>((rank_ + 1) % world_), tag(step, k)));
  }

  static void wait_work(const c10::intrusive_ptr<c10d::Work>& work, Clock::time_point deadline) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    // Gloo's aborted send or receive returns false instead of throwing.
    if (!work->wait(std::max(left, std::chrono::milliseconds(1))))
      throw std::runtime_error("commsched: ring message aborted (its group is retired)");
  }

  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  Collective op_;
  at::Tensor input_;
  at::Tensor output_;
  int64_t tag_base_;
  int64_t world_ = 1;
  int64_t rank_ = 0;
  int64_t shard_ = 0;
  int64_t chunks_ = 1;
  int64_t per_chunk_ = 0;
  std::vector<at::Tensor> accumulators_;  // reduce-scatter: steps 0 .. p-3 (the last is output)
  std::vector<c10::intrusive_ptr<c10d::Work>> recvs_;
  std::vector<c10::intrusive_ptr<c10d::Work>> sends_;
  bool finished_ = false;
  std::mutex mu_;  // recvs_, sends_ and aborted_ (abort() comes from another thread)
  bool aborted_ = false;
};

}  // namespace

int64_t ring_tags(int64_t world, int64_t shard_numel, int64_t element_size) {
  return std::max<int64_t>(1, world - 1) * chunks_per_shard(shard_numel, element_size);
}

std::unique_ptr<PendingCollective> launch_ring(const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                                               Collective op, const at::Tensor& input,
                                               const at::Tensor& output, int64_t tag_base) {
  TORCH_CHECK(op != Collective::kAllreduce,
              "commsched: the ring runs reduce-scatter and all-gather only");
  TORCH_CHECK(input.is_contiguous() && output.is_contiguous() && input.dim() == 1 &&
                  output.dim() == 1 && input.scalar_type() == output.scalar_type(),
              "commsched: ring collectives take flat contiguous tensors of one dtype");
  const int64_t world = group->getSize();
  const int64_t shard = op == Collective::kReduceScatter ? output.numel() : input.numel();
  TORCH_CHECK((op == Collective::kReduceScatter ? input.numel() : output.numel()) == shard * world,
              "commsched: ring ", collective_name(op), " needs ", world, " shards of ", shard,
              " elements");
  return std::make_unique<RingCollective>(group, op, input, output, tag_base);
}

}  // namespace commsched
