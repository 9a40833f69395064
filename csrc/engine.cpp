#include "engine.h"

#include "completion_wait.h"
#include "fusion_buffer.h"

#include <c10/core/StreamGuard.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <sstream>
#include <stdexcept>

namespace commsched {

namespace {
constexpr auto kPollInterval = std::chrono::milliseconds(50);
}  // namespace

Engine::Engine(std::shared_ptr<Transport> transport, std::vector<std::string> tensor_names,
               int64_t timeout_ms)
    : transport_(std::move(transport)),
      tensor_names_(std::move(tensor_names)),
      timeout_ms_(timeout_ms) {
  TORCH_CHECK(transport_, "commsched: Engine needs a transport");
  world_size_ = transport_->world_size();
  local_ = dynamic_cast<LocalTransport*>(transport_.get()) != nullptr;
  TORCH_CHECK(timeout_ms_ > 0, "commsched: timeout must be positive, got ", timeout_ms_, " ms");
  const auto n = tensor_names_.size();
  tensor_blocks_.assign(n, {});
  grads_.assign(n, at::Tensor());
  ready_events_.assign(n, nullptr);
  ready_us_.assign(n, -1);
  if (local_) return;  // Note [A world of one]: blocks complete in the caller's thread
  engine_thread_ = std::thread([this] { engine_loop(); });
  completion_thread_ = std::thread([this] { completion_loop(); });
}

Engine::~Engine() {
  shutdown();
  // Note [A failed collective is not touched again]: never freed.
  if (!abandoned_.empty()) new std::vector<InFlight>(std::move(abandoned_));
}

// Note [Retiring a group]
// A group retired after a failure (an elastic job's unbind and re-form) may still have
// collectives in flight, and a Gloo collective on a peer that is alive waits until that peer
// either answers or closes its side. Two rules keep every rank out of that wait:
// * A retired group's connections close promptly on every rank, the same way: its sends and
//   receives are aborted (Gloo's Work::abort), and nothing keeps the group or its Gloo contexts
//   alive afterwards: the abandoned collectives of CPU tensors are dropped once the threads are
//   joined (a ring's Works and a Gloo all-reduce's AsyncWork each hold the group's context; kept
//   forever, as before, they left the peers' receives from this rank waiting their full timeout,
//   and a peer destroying its own group joined a Gloo worker blocked on one of them). A peer
//   blocked on this rank then fails at once ("Connection closed by peer").
// * No caller joins a thread that may wait on a peer: an engine that failed or has a collective
//   in flight hands its two threads, its transport and its abandoned collectives to a detached
//   thread, which joins and drops them there (the group's destructor joins Gloo's workers, one
//   of which may sit in an all-reduce, which Gloo cannot abort, until the peers close theirs).
// An idle engine (a clean shutdown) joins and drops everything in the caller, as before. The
// abandoned collectives of device tensors are still never freed (Note [A failed collective is
// not touched again]).
void Engine::release_transport() {
  stop_and_wake();
  abort_in_flight();
  bool idle;
  {
    std::lock_guard<std::mutex> lock(flight_mu_);
    idle = waiting_ == nullptr && in_flight_.empty();
  }
  if (idle && !failed()) {
    join_threads();  // idle: nothing waits on a peer
    if (abandoned_.empty()) {  // else a block was launched as the engine stopped
      transport_.reset();
      return;
    }
  }
  auto self = shared_from_this();
  std::thread([self] {
    self->join_threads();
    self->drop_retired();
  }).detach();
}

void Engine::abort_in_flight() {
  std::lock_guard<std::mutex> lock(flight_mu_);
  if (waiting_ != nullptr) waiting_->abort();
  for (auto& item : in_flight_) item.collective->abort();
}

// After join_threads(): the threads are gone, abandoned_ is ours.
void Engine::drop_retired() {
  std::vector<InFlight> device;
  for (auto& item : abandoned_) {
    if (item.stream) {
      device.push_back(std::move(item));
      continue;
    }
    item.collective->abort();  // receives still posted by a failed ring
  }
  abandoned_ = std::move(device);
  transport_.reset();
}

// Note [Waking the threads to stop]
// stop_ is an atomic read inside each wait's predicate, under the wait's own mutex; setting it
// does not take that mutex. A thread that has just found the predicate false, and not yet
// blocked, would miss a notify sent in between and sleep for good (the completion thread's wait
// for work has no deadline): a 3-rank test hung here once, rank 0 joining its threads in
// shutdown while the others waited for it in the next optimizer's first collective. Taking
// each mutex once after setting stop_ orders the notify after any such check: the thread either
// saw stop_ or is already blocked and is woken.
void Engine::shutdown() {
  stop_and_wake();
  join_threads();
}

void Engine::stop_and_wake() {
  if (stop_.exchange(true)) return;
  ready_queue_.wake_all();
  { std::lock_guard<std::mutex> lock(flight_mu_); }
  flight_cv_.notify_all();
  { std::lock_guard<std::mutex> lock(credit_mu_); }
  credit_cv_.notify_all();
  { std::lock_guard<std::mutex> lock(mu_); }
  done_cv_.notify_all();
}

void Engine::join_threads() {
  std::lock_guard<std::mutex> lock(join_mu_);
  if (engine_thread_.joinable()) engine_thread_.join();
  if (completion_thread_.joinable()) completion_thread_.join();
}

void Engine::install_plan(std::vector<BlockSpec> blocks) {
  std::lock_guard<std::mutex> lock(mu_);
  TORCH_CHECK(error_.empty(), "commsched: engine failed earlier: ", error_);
  bool idle = next_launch_.load() == 0 &&
              std::all_of(ready_us_.begin(), ready_us_.end(), [](int64_t t) { return t < 0; });
  TORCH_CHECK(idle, "commsched: a plan can only be installed between iterations");
  const auto n = static_cast<int64_t>(tensor_names_.size());
  std::vector<std::vector<int64_t>> tensor_blocks(n);
  for (size_t pos = 0; pos < blocks.size(); ++pos) {
    const auto& block = blocks[pos];
    TORCH_CHECK(!block.pieces.empty(), "commsched: block ", block.block_id, " has no pieces");
    TORCH_CHECK(block.source >= -1 && (block.source == -1 || block.op == Collective::kAllGather),
                "commsched: block ", block.block_id, " has source ", block.source,
                "; only an all-gather names a source (-1: none)");
    if (block.op == Collective::kAllGather && block.source >= 0) {
      TORCH_CHECK(block.source < static_cast<int64_t>(pos) &&
                      blocks[block.source].op == Collective::kReduceScatter,
                  "commsched: all-gather block ", block.block_id,
                  " names a source that is not an earlier reduce-scatter block");
    }
    for (const auto& piece : block.pieces) {
      TORCH_CHECK(piece.tensor_id >= 0 && piece.tensor_id < n, "commsched: block ",
                  block.block_id, " names tensor ", piece.tensor_id, " of ", n);
      TORCH_CHECK(piece.offset >= 0 && piece.numel > 0, "commsched: block ", block.block_id,
                  " has an empty or negative piece of tensor ", piece.tensor_id);
      if (block.released_by_caller) continue;  // readiness comes from release(), not gradients
      auto& owners = tensor_blocks[piece.tensor_id];
      if (owners.empty() || owners.back() != static_cast<int64_t>(pos)) owners.push_back(pos);
    }
  }
  plan_ = std::move(blocks);
  tensor_blocks_ = std::move(tensor_blocks);
  pool_.clear();  // Note [Host fusion buffers are kept] (buffer_pool.cpp): sizes are the plan's
  reset_iteration_locked();
}

void Engine::reset_iteration_locked() {
  block_pending_.assign(plan_.size(), 0);
  for (const auto& owners : tensor_blocks_)
    for (auto pos : owners) block_pending_[pos] += 1;
  for (size_t pos = 0; pos < plan_.size(); ++pos)
    if (plan_[pos].released_by_caller) block_pending_[pos] = 1;
  shards_.assign(plan_.size(), at::Tensor());
  std::fill(grads_.begin(), grads_.end(), at::Tensor());
  std::fill(ready_events_.begin(), ready_events_.end(), nullptr);
  std::fill(ready_us_.begin(), ready_us_.end(), -1);
  done_events_.assign(plan_.size(), nullptr);
  block_events_.assign(plan_.size(), BlockEvents{});
  clock_.reset();
  launched_.assign(plan_.size(), false);
  timings_.assign(plan_.size(), BlockTiming{0, 0, -1, -1, -1, 0});
  next_launch_ = 0;
  completed_ = 0;
  ready_queue_.clear();
  for (size_t pos = 0; pos < plan_.size(); ++pos)
    if (block_pending_[pos] == 0) ready_queue_.push(pos);  // cannot happen for a valid plan
}

void Engine::mark_ready(int64_t tensor_id, const at::Tensor& grad) {
  const int64_t ts = now_us();
  // Other streams read the gradient after this event, and ready times on a device come from it
  // (Note [Device time]); null on CPU.
  auto event = local_ && !local_ready_events_ ? nullptr : DeviceSync::record_ready(grad);
  std::vector<int64_t> now_ready;
  {
    std::lock_guard<std::mutex> lock(mu_);
    TORCH_CHECK(error_.empty(), "commsched: engine failed earlier: ", error_);
    TORCH_CHECK(tensor_id >= 0 && tensor_id < static_cast<int64_t>(grads_.size()),
                "commsched: unknown tensor id ", tensor_id);
    TORCH_CHECK(ready_us_[tensor_id] < 0, "commsched: gradient of '", tensor_names_[tensor_id],
                "' was marked ready twice in one iteration");
    grads_[tensor_id] = grad;
    ready_events_[tensor_id] = event;
    clock_.anchor(event, ts);
    ready_us_[tensor_id] = ts;
    for (auto pos : tensor_blocks_[tensor_id]) {
      if (--block_pending_[pos] == 0) {
        timings_[pos].ready_us = ts;
        block_events_[pos].ready = event;
        now_ready.push_back(pos);
      }
    }
  }
  // Events only when a timeline is written: this runs once per gradient.
  if (timeline_.enabled()) timeline_.instant("ready:" + tensor_names_[tensor_id], 0, ts);
  for (auto pos : now_ready) ready_queue_.push(pos);
  if (local_ && !now_ready.empty()) complete_local();
}

// Note [A world of one]
// With no peer there is nothing to reduce: every collective would leave the gradient as it is
// (Horovod's optimizer does nothing at size 1 either: no compression, no pre/post-scaling). So
// a local engine starts no threads, packs nothing and launches nothing: a block completes in
// the caller's thread as soon as it is ready and every block before it has completed (plan
// order still holds), with its timings recorded for the profiler. What is left of the engine's
// cost is the bookkeeping of mark_ready, and for device gradients a timing event each, which
// only the profiler reads: Python turns them on for the iterations it samples only
// (set_local_ready_events). local_mu_ serialises callers: one drains what another
// made ready, so no ready block is left behind in the queue.
void Engine::complete_local() {
  std::lock_guard<std::mutex> drain(local_mu_);
  int64_t position = -1;
  while (ready_queue_.try_pop_expected(next_launch_.load(), &position)) {
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t now = now_us();
    int64_t bytes = 0;
    for (const auto& piece : plan_[position].pieces)
      bytes += piece.numel * static_cast<int64_t>(c10::elementSize(plan_[position].wire_dtype));
    timings_[position] = BlockTiming{plan_[position].block_id, bytes, timings_[position].ready_us,
                                     now, now, 0};
    launched_[position] = true;
    next_launch_ = position + 1;
    completed_ += 1;
  }
  done_cv_.notify_all();
}

bool Engine::is_ready(int64_t tensor_id) {
  std::lock_guard<std::mutex> lock(mu_);
  TORCH_CHECK(tensor_id >= 0 && tensor_id < static_cast<int64_t>(ready_us_.size()),
              "commsched: unknown tensor id ", tensor_id);
  return ready_us_[tensor_id] >= 0;
}

std::vector<int64_t> Engine::not_ready_tensors() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int64_t> out;
  for (size_t t = 0; t < ready_us_.size(); ++t)
    if (ready_us_[t] < 0 && !tensor_blocks_[t].empty()) out.push_back(t);
  return out;
}

void Engine::engine_loop() {
  auto expected = [this] { return next_launch_.load(); };
  auto stop = [this] { return stopping(); };
  while (!stopping()) {
    int64_t position = -1;
    auto deadline = std::chrono::steady_clock::now() + kPollInterval;
    if (!ready_queue_.pop_expected(expected, stop, deadline, &position)) continue;
    try {
      launch(position);
    } catch (const std::exception& e) {
      fail(std::string("launching block ") + std::to_string(plan_[position].block_id) + ": " +
           e.what());
    }
  }
}

void Engine::launch(int64_t position) {
  const BlockSpec* block;
  std::vector<std::shared_ptr<c10::Event>> events;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_.empty()) return;
    block = &plan_[position];
    for (const auto& piece : block->pieces) events.push_back(ready_events_[piece.tensor_id]);
    launched_[position] = true;
    next_launch_ = position + 1;
  }
  // Read in place, not copied: see the comment on grads_ in engine.h.
  const std::vector<at::Tensor>& grads = grads_;
  const int64_t start = now_us();
  const auto& device = grads[block->pieces[0].tensor_id].device();
  auto stream = DeviceSync::comm_stream(device);
  std::optional<c10::StreamGuard> guard;
  if (stream) {
    guard.emplace(*stream);
    for (const auto& event : events) DeviceSync::stream_wait(*stream, event);
    for (const auto& piece : block->pieces) DeviceSync::record_stream(grads[piece.tensor_id], *stream);
  }
  auto pack_event = DeviceSync::record_on(stream);
  const int64_t world = transport_->world_size();
  at::Tensor input, output;
  switch (block->op) {
    case Collective::kAllreduce:
      input = output = FusionBuffer::pack(*block, grads, FusionBuffer::numel(*block), pool_);
      break;
    case Collective::kReduceScatter: {
      const int64_t padded = FusionBuffer::padded(FusionBuffer::numel(*block), world);
      input = FusionBuffer::pack(*block, grads, padded, pool_);
      output = pool_.take(padded / world, input.options());
      break;
    }
    case Collective::kAllGather:
      if (block->source < 0) {
        // Standalone all-gather: every rank owns the rank-th of `world` equal slices of the
        // packed block (K-FAC shares the inverses each rank computed this way).
        const int64_t padded = FusionBuffer::padded(FusionBuffer::numel(*block), world);
        const int64_t slice = padded / world;
        input = FusionBuffer::pack(*block, grads, padded, pool_)
                    .narrow(0, transport_->rank() * slice, slice);
        output = pool_.take(input.numel() * world, input.options());
      } else {
        input = source_shard(*block);
        if (!input.defined()) return;  // failed or stopping while waiting
        // Note [An all-gather lands in the gradient it came from] (fusion_buffer.cpp)
        if (block->postscale != 1.0) input.mul_(block->postscale);
        output = FusionBuffer::gather_output(*block, grads, input.numel() * world, input.options(),
                                               pool_);
      }
      break;
  }
  const int64_t packed = now_us();
  // Zero-copy: a block that is one piece of a contiguous gradient of the wire dtype is reduced
  // in the gradient's own memory. Anything else was copied into a fusion buffer; count it.
  if (!input.is_alias_of(grads[block->pieces[0].tensor_id]))
    packed_bytes_ += input.numel() * static_cast<int64_t>(input.element_size());
  const int64_t bytes = output.numel() * static_cast<int64_t>(output.element_size());
  // On a device the host times above are only the enqueueing: complete() adds the device's spans.
  if (timeline_.enabled() && !stream)
    timeline_.span("pack", 1, start, packed, block->block_id, bytes, collective_name(block->op));
  acquire_credit(bytes);
  auto start_event = DeviceSync::record_on(stream);
  auto collective = transport_->launch(block->op, input, output);
  {
    std::lock_guard<std::mutex> lock(mu_);
    timings_[position].block_id = block->block_id;
    timings_[position].bytes = bytes;
    timings_[position].launch_us = now_us();
  }
  {
    std::lock_guard<std::mutex> lock(flight_mu_);
    in_flight_.push_back(InFlight{position, bytes, input, output, std::move(collective), stream,
                                  std::move(pack_event), std::move(start_event)});
  }
  flight_cv_.notify_all();
}

at::Tensor Engine::source_shard(const BlockSpec& block) {
  std::unique_lock<std::mutex> lock(mu_);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms_);
  bool done = done_cv_.wait_until(lock, deadline, [&] {
    return completed_ > block.source || !error_.empty() || stopping();
  });
  if (!error_.empty() || stopping()) return at::Tensor();
  TORCH_CHECK(done, "commsched: all-gather block ", block.block_id,
              " timed out waiting for its reduce-scatter (position ", block.source, ")");
  return shards_[block.source];
}

void Engine::acquire_credit(int64_t bytes) {
  std::unique_lock<std::mutex> lock(credit_mu_);
  credit_cv_.wait(lock, [&] {
    return credit_bytes_ <= 0 || in_flight_bytes_ == 0 ||
           in_flight_bytes_ + bytes <= credit_bytes_ || stopping();
  });
  in_flight_bytes_ += bytes;
}

void Engine::return_credit(int64_t bytes) {
  {
    std::lock_guard<std::mutex> lock(credit_mu_);
    in_flight_bytes_ -= bytes;
  }
  credit_cv_.notify_all();
}

void Engine::set_credit(int64_t bytes) {
  TORCH_CHECK(bytes >= 0, "commsched: credit must be >= 0 bytes, got ", bytes);
  {
    std::lock_guard<std::mutex> lock(credit_mu_);
    credit_bytes_ = bytes;
  }
  credit_cv_.notify_all();
}

// Note [A failed collective is not touched again]
// A collective that failed or timed out may still be running in its backend: a peer that was
// slow rather than dead, or, on a device, Gloo's copies to and from host memory queued on the
// communication stream. Waiting on it again, unpacking its output or freeing its buffers while
// the backend still writes them is how a process dies of a segmentation fault instead of
// raising the engine's error. So once the engine has failed (or is stopping), the completion
// thread takes every collective still in flight off the queue without waiting for it, and the
// failed one with them, and keeps them as they are in `abandoned_`; the engine's destructor
// leaks them rather than free what a backend may still write. Nothing else reaches them: the
// launch thread launches nothing after a failure, and every wait returns the error.
void Engine::completion_loop() {
  while (true) {
    InFlight item;
    {
      std::unique_lock<std::mutex> lock(flight_mu_);
      flight_cv_.wait(lock, [this] { return stopping() || !in_flight_.empty(); });
      if (in_flight_.empty()) return;  // stopping, nothing left
      item = std::move(in_flight_.front());
      in_flight_.pop_front();
    }
    bool abandon = failed();
    {
      // Under flight_mu_: release_transport() sets stop_ before it aborts waiting_ under it.
      std::lock_guard<std::mutex> lock(flight_mu_);
      abandon = abandon || stopping();
      if (!abandon) waiting_ = item.collective.get();
    }
    if (abandon) {
      return_credit(item.bytes);
      abandoned_.push_back(std::move(item));
      continue;
    }
    try {
      complete(item);
      {
        std::lock_guard<std::mutex> lock(flight_mu_);
        waiting_ = nullptr;
      }
      return_credit(item.bytes);
    } catch (const std::exception& e) {
      {
        std::lock_guard<std::mutex> lock(flight_mu_);
        waiting_ = nullptr;
      }
      return_credit(item.bytes);
      fail(std::string("collective of block ") + std::to_string(plan_[item.position].block_id) +
           " failed: " + e.what());
      abandoned_.push_back(std::move(item));
    }
  }
}

bool Engine::failed() {
  std::lock_guard<std::mutex> lock(mu_);
  return !error_.empty();
}

void Engine::complete(InFlight& item) {
  const BlockSpec& block = plan_[item.position];
  std::optional<c10::StreamGuard> guard;
  if (item.stream) guard.emplace(*item.stream);
  const int64_t waiting_since = now_us();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms_);
  try {
    if (item.stream) {
      wait_on_device(item, deadline);
    } else {
      item.collective->wait(std::chrono::milliseconds(timeout_ms_));
    }
  } catch (const std::exception& e) {
    // The transport's own timeout and wait_all's race: say which limit ran out either way.
    if ((now_us() - waiting_since) / 1000 + 50 < timeout_ms_) throw;
    std::ostringstream message;
    message << "timed out after " << timeout_ms_ / 1000.0 << " s (COMMSCHED_TIMEOUT): " << e.what();
    throw std::runtime_error(message.str());
  }
  const int64_t done = now_us();
  auto end_event = DeviceSync::record_on(item.stream);
  const std::vector<at::Tensor>& grads = grads_;  // in place: see engine.h
  if (block.op == Collective::kAllreduce)
    FusionBuffer::unpack(block, item.buffer, grads, block.postscale);
  if (block.op == Collective::kAllGather)  // a pair's shard was scaled when it was sent
    FusionBuffer::unpack(block, item.output, grads, block.source < 0 ? block.postscale : 1.0);
  const int64_t unpacked = now_us();
  auto done_event = DeviceSync::record_on(item.stream);
  // The block counts as completed (credit returned, waiters woken) once the device has passed the
  // collective's end: on a device, Work reports the end of the collective, not of the copies the
  // backend orders after it (Gloo's copy back from host memory).
  TORCH_CHECK(!end_event || event_done_by(*end_event, deadline),
              "timed out after ", timeout_ms_ / 1000.0,
              " s (COMMSCHED_TIMEOUT): the device did not reach the end of the collective");
  BlockEvents events;
  {
    std::lock_guard<std::mutex> lock(mu_);
    events = block_events_[item.position];
  }
  events.pack = item.pack_event;
  events.start = item.start_event;
  events.end = end_event;
  if (timeline_.enabled() && item.stream) device_spans(item, events, done_event, deadline);
  std::lock_guard<std::mutex> lock(mu_);
  block_events_[item.position] = events;
  auto& timing = timings_[item.position];
  timing.done_us = done;
  const int64_t previous_done = item.position > 0 ? timings_[item.position - 1].done_us : -1;
  timing.service_us = done - std::max(timing.launch_us, previous_done);
  if (timeline_.enabled() && !item.stream) {
    timeline_.span(collective_name(block.op), 2, timing.launch_us, done, block.block_id,
                   timing.bytes, collective_name(block.op));
    timeline_.span("unpack", 2, done, unpacked, block.block_id, timing.bytes,
                   collective_name(block.op));
  }
  done_events_[item.position] = done_event;
  if (block.op == Collective::kReduceScatter) shards_[item.position] = item.output;
  completed_ += 1;
  done_cv_.notify_all();
}

}  // namespace commsched
