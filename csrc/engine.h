// The engine: executes an installed plan on two background threads.
//   caller (autograd hook) --mark_ready--> per-piece ready state --> ReadyQueue
//   engine thread:     pops blocks strictly in plan order, packs, launches the collective
//   completion thread: waits for each collective in launch order, unpacks, records timings
// wait_all() blocks the caller (GIL released) until every block is done, or raises an error that
// names the blocks and tensors that were not ready.
//
// Note [The order is the plan's]
// c10d pairs collectives across ranks by the order they are issued in, so the engine thread
// launches blocks strictly in plan position order: a block whose pieces are ready early waits
// for every block before it, and a late gradient delays the rest but never reorders them. Every
// rank runs the identical plan (Python compares fingerprints before install_plan), so the same
// collectives are issued in the same order everywhere. Only pacing is dynamic: the credit bound
// and the caller's release() of forward-stage blocks decide *when*, never *which next*.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Event.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "buffer_pool.h"
#include "device_clock.h"
#include "device_sync.h"
#include "plan_types.h"
#include "ready_queue.h"
#include "timeline.h"
#include "transport.h"

namespace commsched {

// Timings of one block in the last finished iteration, for the profiler (us on the steady-clock
// axis; for device tensors read from events, Note [Device time]).
struct BlockTiming {
  int64_t block_id;
  int64_t bytes;
  int64_t ready_us;    // last piece became ready
  int64_t launch_us;   // collective handed to the transport
  int64_t done_us;     // collective finished
  int64_t service_us;  // done - max(launch, previous block's done): time the channel spent on it
};

// Which clock the last finished iteration's figures came from.
struct Clocks {
  Clock ready;       // tensors' ready times
  Clock collective;  // blocks' launch, done and service times
};

class Engine : public std::enable_shared_from_this<Engine> {
 public:
  Engine(std::shared_ptr<Transport> transport, std::vector<std::string> tensor_names,
         int64_t timeout_ms);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  void install_plan(std::vector<BlockSpec> blocks);
  void mark_ready(int64_t tensor_id, const at::Tensor& grad);
  bool is_ready(int64_t tensor_id);
  std::vector<int64_t> not_ready_tensors();
  // Waits for every block of the iteration; on success resets the state for the next one.
  void wait_all(int64_t timeout_ms);
  // Waits until the block at plan `position` (and so every block before it) has completed.
  void wait_block(int64_t position, int64_t timeout_ms);
  // Makes a caller-released (forward-stage) block ready to launch.
  void release(int64_t position);
  // This rank's slice of the completed reduce-scatter at plan `position` (summed, not yet
  // scaled): the engine's own buffer, valid until the iteration ends (a sharded step updates
  // from it; plan/sharding.py). A reduce-scatter with a paired all-gather is not asked for: the
  // all-gather scales its shard in place when it launches.
  at::Tensor reduced_shard(int64_t position);
  // Most bytes in flight at once (0: no limit); one block is always allowed.
  void set_credit(int64_t bytes);
  // Whether a world of one records ready events for device gradients in the coming iterations
  // (Note [A world of one]); other engines always do, their comm stream waits on them.
  void set_local_ready_events(bool on) { local_ready_events_ = on; }
  // The last finished iteration's figures. For device tensors they are read from events here,
  // waiting (at most the engine's timeout) for any the device has not reached yet.
  std::vector<int64_t> last_ready_us();
  std::vector<BlockTiming> last_block_timings();
  Clocks last_clocks();
  Timeline& timeline() { return timeline_; }
  void shutdown();
  // Stops the threads and retires the transport (Note [Retiring a group], engine.cpp): an idle
  // engine joins its threads and drops it here; one that failed or has a collective in flight
  // aborts what it can and hands threads and transport to a detached thread, so that the caller
  // never joins a thread that waits on a peer. Call without the GIL, and instead of shutdown():
  // Gloo's destructor joins worker threads that may need the GIL to free a tensor.
  void release_transport();
  int64_t world_size() const { return world_size_; }
  // Bytes copied into fusion buffers since the engine was made (zero-copy blocks add nothing).
  int64_t packed_bytes() const { return packed_bytes_.load(); }
  // The host fusion buffers kept for reuse (Note [Host fusion buffers are kept]).
  BufferPool& buffer_pool() { return pool_; }
  // The caller's waits (wait_all, wait_block), kept here so that no Python runs around each:
  // since when the caller waits (-1: it does not), for the heartbeats, and the total so far,
  // which the profiler takes out of compute.
  int64_t waiting_since_us() const { return waiting_since_us_.load(); }
  int64_t waited_us() const { return waited_us_.load(); }

 private:
  struct InFlight {
    int64_t position;
    int64_t bytes;
    at::Tensor buffer;  // the collective's input (for allreduce also its output)
    at::Tensor output;
    std::unique_ptr<PendingCollective> collective;
    std::optional<c10::Stream> stream;
    std::shared_ptr<c10::Event> pack_event;   // on the comm stream before the pack
    std::shared_ptr<c10::Event> start_event;  // on the comm stream as the collective is launched
  };

  // A block's timing events (device tensors only; null on CPU), Note [Device time].
  struct BlockEvents {
    std::shared_ptr<c10::Event> ready;  // the ready event of the gradient that completed it
    std::shared_ptr<c10::Event> pack;
    std::shared_ptr<c10::Event> start;
    std::shared_ptr<c10::Event> end;    // the collective ended (before the unpack)
  };

  void complete_local();
  bool failed();
  void engine_loop();
  void completion_loop();
  void launch(int64_t position);
  void complete(InFlight& item);
  void wait_on_device(InFlight& item, std::chrono::steady_clock::time_point deadline);
  void device_spans(const InFlight& item, const BlockEvents& events,
                    const std::shared_ptr<c10::Event>& done_event,
                    std::chrono::steady_clock::time_point deadline);
  void fail(const std::string& message);
  void acquire_credit(int64_t bytes);
  void return_credit(int64_t bytes);
  at::Tensor source_shard(const BlockSpec& block);
  void wait_done_locked(std::unique_lock<std::mutex>& lock, int64_t count, int64_t timeout_ms);
  std::string pending_report();
  void reset_iteration_locked();
  bool stopping() const { return stop_.load(); }
  void stop_and_wake();
  void join_threads();
  void abort_in_flight();
  void drop_retired();

  std::shared_ptr<Transport> transport_;
  int64_t world_size_ = 1;
  bool local_ = false;  // a world of one: no threads, no transport work (Note [A world of one])
  std::atomic<bool> local_ready_events_{true};
  std::mutex local_mu_;
  std::vector<std::string> tensor_names_;
  int64_t timeout_ms_;
  Timeline timeline_;

  std::mutex mu_;
  std::condition_variable done_cv_;
  std::vector<BlockSpec> plan_;
  std::vector<std::vector<int64_t>> tensor_blocks_;  // tensor id -> plan positions holding it
  std::vector<int64_t> block_pending_;                // tensors of the block not yet ready
  // An entry is written once per iteration, by mark_ready, before any block holding it can
  // become ready, and is cleared only by reset_iteration_locked once every block has completed.
  // So the engine and completion threads read a ready block's entries without mu_ (other
  // threads only write other entries meanwhile) instead of copying the vector per block.
  std::vector<at::Tensor> grads_;
  std::vector<at::Tensor> shards_;                    // reduce-scatter outputs by plan position
  std::vector<std::shared_ptr<c10::Event>> ready_events_;
  std::vector<int64_t> ready_us_;                     // -1: not ready in this iteration
  std::vector<std::shared_ptr<c10::Event>> done_events_;
  std::vector<BlockTiming> timings_;
  std::vector<BlockTiming> last_timings_;
  std::vector<int64_t> last_ready_us_;
  DeviceClock clock_;       // this iteration's anchor (Note [Device time])
  std::vector<BlockEvents> block_events_;
  DeviceClock last_clock_;  // the last finished iteration's, with its events:
  std::vector<BlockEvents> last_block_events_;
  std::vector<std::shared_ptr<c10::Event>> last_ready_events_;
  std::vector<bool> launched_;
  std::atomic<int64_t> next_launch_{0};  // read by the ready queue without mu_
  int64_t completed_ = 0;
  std::string error_;

  ReadyQueue ready_queue_;
  std::mutex flight_mu_;
  std::condition_variable flight_cv_;
  std::deque<InFlight> in_flight_;
  // Failed, or in flight when the engine failed or stopped; the completion thread's alone (Note
  // [A failed collective is not touched again]).
  std::vector<InFlight> abandoned_;
  // The collective the completion thread waits on (flight_mu_), for abort_in_flight().
  PendingCollective* waiting_ = nullptr;
  std::mutex join_mu_;

  std::mutex credit_mu_;
  std::condition_variable credit_cv_;
  int64_t credit_bytes_ = 0;
  int64_t in_flight_bytes_ = 0;

  std::atomic<bool> stop_{false};
  BufferPool pool_;
  std::atomic<int64_t> packed_bytes_{0};
  std::atomic<int64_t> waiting_since_us_{-1};
  std::atomic<int64_t> waited_us_{0};
  std::thread engine_thread_;
  std::thread completion_thread_;
};

}  // namespace commsched
