"""Python side of the engine: hands a Plan to commsched._C and keeps the timeline and profiler
fed, and runs the comm hook registered on it beside the plan's collectives, a hook with its own
state as DDP's comm hooks hold a PowerSGDState. The work itself happens in commsched._C on
background threads."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Protocol

import torch
import torch.distributed as dist

from ... import _C
from ...compression import Compressor
from ...plan import Collective, Plan, Stage, TensorSpec, dtype_name
from ...plan.compressed import WireLayout
from ...world import World, registry
from ...world.errors import RankFailureError, without_backtrace
from .profiler import Profiler
from .timeline import TimelineWriter

# Note [Compression is a comm hook]
# Lossy compression changes four moments of an iteration: a gradient's hand-over (it goes to the
# compressor, which marks its wire tensors ready), the end of backward (gradients not produced
# still count, as zeros), the wait at synchronize() or step() (PowerSGD's second round before it,
# the gradients rebuilt after it), and the end of the iteration (compression starts at its
# start_step, top-k moves through its warm-up stages). Each is one method of CommHook, whose
# default does what an uncompressed run needs: nothing, the engine taking the gradient as it is.
# The session, the gradient hooks, the step modes and the overlap runner call the engine's hook at
# those moments and never ask whether compression runs; LossyHook (lossy_hook.py) holds the
# compressor and its scale and answers them itself (compressing or not yet, by its start_step).


class RunningCompressor(Protocol):
    """What an overlap plan's layout reads of a compressor while it runs
    (runtime/modes/overlap/layout.py)."""

    ids: list[int]  # the compressed tensors, by index

    @property
    def layout(self) -> WireLayout: ...


class CommHook:
    """The default hook: every gradient goes to the engine as it is."""

    # Tensor ids whose hand-over is Python's: the C++ gradient intake leaves them to the
    # slow path (runtime/intake/gradient_intake.py), which offers them to `hand_over`.
    python_ids: tuple[int, ...] = ()
    # Whether the hook's work matters in a world of one too (error feedback changes the
    # gradients there): such a session never steps as the plain optimizer.
    works_alone = False

    def hand_over(self, tensor_id: int, grad: torch.Tensor) -> bool:
        """Offers the finished gradient of `tensor_id`; returns whether the hook took it (else
        the engine takes it as it is)."""
        return False

    def launch_rest(self) -> None:
        """At step(): the hook's gradients not produced on this rank, as zeros."""

    def before_wait(self, plan: Plan) -> None:
        """Before a synchronous wait for every block of `plan`."""

    def after_wait(self) -> None:
        """After that wait: the gradients in ``p.grad`` as the optimizer is to see them."""

    def deferred_round(self, plan: Plan, before_wait: Callable[[int], None]) -> None:
        """At an overlap plan's step(): what must be launched before step() returns;
        `before_wait(position)` runs before any wait for the block at `position`."""

    def iteration_ended(self, iteration: int) -> None:
        """After the iteration that `iteration` now counts."""

    def running(self) -> RunningCompressor | None:
        """The compressor whose gradients an overlap plan's groups rebuild, while it runs."""
        return None

    def decompress(self, index: int, out: torch.Tensor) -> None:
        """Rebuilds the hook's gradient `index` into `out` (an overlap plan's group update)."""
        raise AssertionError("commsched: an uncompressed run rebuilds no gradient")


# Per process set (None: the whole world): ranks outside a set make none of its engines.
_engine_ids: dict[tuple[int, ...] | None, itertools.count] = {}


def _next_engine_id(world: World) -> str:
    """Equal on every rank of `world`, since every one of them wraps in the same order."""
    number = next(_engine_ids.setdefault(world.members, itertools.count()))
    if world.members is None:
        return str(number)
    return f"{number}@ranks {','.join(map(str, world.members))}"


def check_collective_codes() -> None:
    """Python's Collective enum and the extension's codes must agree: a block's op crosses the
    boundary as its number. A stale build of commsched._C is the usual cause of a mismatch."""
    ours = {c.name.lower(): int(c) for c in Collective}
    theirs = dict(_C.collective_codes())
    if ours != theirs:
        raise ImportError(f"commsched: the Collective codes of commsched.plan ({ours}) differ "
                          f"from those of the compiled engine commsched._C ({theirs}); rebuild "
                          "the extension (scripts/setup.sh, or pip install -e .)")


check_collective_codes()


class EngineHandle:
    # What its tensors are, in the heartbeats and the failure diagnosis (K-FAC's exchanges name
    # theirs): a wrapped optimizer's engine carries gradients.
    label = "gradients"
    # Test-only, never a user knob: a world of one gets a process group of its own (of the
    # initialised default group's backend) instead of the local engine without threads, so that
    # tests/test_policies_cuda.py can drive the process-group transport with an NCCL group of one
    # (NCCL refuses two ranks on one GPU). Needs torch.distributed initialised by the test.
    process_group_at_size_one = False

    def __init__(self, world: World, specs: list[TensorSpec], timeout: float,
                 timeline: str = "", iteration: Callable[[], int] | None = None) -> None:
        self.specs = specs
        self.engine_id = _next_engine_id(world)
        # A world of one (a lone process, or a rank outside its optimizer's process set) waits
        # for nobody: its progress says nothing to the other ranks' heartbeats.
        self.has_peers = world.size > 1
        # Rounds of wait(): one per iteration for K-FAC's exchanges. A session passes its own
        # iteration counter instead, so that the heartbeats report the one the user sees.
        self.rounds = 0
        # Every how many rounds the profiler records one: every round while a plan is being
        # profiled, then a sample now and then is enough (auto's late re-check reads the
        # latest ones), which keeps the per-iteration Python small.
        self._sample_every = 1
        # Whether the profiler records the round in progress: the figures the session and the
        # runner time themselves (compute before backward, optimizer calls) are then taken too.
        self.sampling = True
        self._ops: list[str] = []
        self._forward_positions: list[int] = []  # the plan's blocks released by the caller
        self._iteration = iteration or (lambda: self.rounds)
        # What the reduction runs beside the plan's collectives (Note [Compression is a comm
        # hook] in engine/handle.py): the default until a compressor's is registered.
        self.comm_hook = CommHook()
        self._world = world
        self.timeout_ms = max(1, int(timeout * 1000))
        self._group = world.new_data_group()
        if self._group is None and self.process_group_at_size_one:
            self._group = dist.new_group(ranks=[0], backend=dist.get_backend())
        # Gloo's reduce-scatter costs about a whole all-reduce: the engine rings its own there
        # (Note [Why the engine rings its own reduce-scatter], csrc/ring.h).
        ring = self._group is not None and dist.get_backend(self._group) == "gloo"
        self._closed = False
        self._engine = _C.Engine(self._group, [s.name for s in specs], self.timeout_ms,
                                 ring_collectives=ring)
        # The extension's own method, no Python frame in between (the gradient hooks' slow path
        # and the zeros of step(); the common case hands gradients over in C++).
        self.mark_ready: Callable[[int, torch.Tensor], None] = self._engine.mark_ready
        # What a session's gradient intake hands gradients to (csrc/gradient_intake.h).
        self.native = self._engine
        self.profiler = Profiler(len(specs), timeout_s=timeout)
        self.plan: Plan | None = None
        self.timeline = TimelineWriter(timeline, world.rank) if timeline else None
        self._engine.set_timeline(self.timeline is not None)
        registry.register(self)

    def register_comm_hook(self, hook: CommHook) -> None:
        """Makes `hook` run at each hand-over, wait and iteration end (Note [Compression is a
        comm hook])."""
        self.comm_hook = hook

    @property
    def sample_every(self) -> int:
        return self._sample_every

    @sample_every.setter
    def sample_every(self, every: int) -> None:
        self._sample_every = every
        self._arm_ready_events()

    def _arm_ready_events(self) -> None:
        """A world of one records device ready events only for the rounds the profiler samples
        (nothing else reads them; Note [A world of one] in csrc/engine.cpp)."""
        sampling = (self.rounds + 1) % self._sample_every == 0
        if sampling != self.sampling:  # the engine starts with them on, as `sampling` does
            self.sampling = sampling
            self._engine.set_local_ready_events(sampling)

    def install(self, plan: Plan, compressor: type[Compressor], prescale: float,
                postscale: float, run: Plan | None = None) -> None:
        """Installs `plan` for the next iteration on.

        Args:
            plan: the plan the session plans, checks and saves (`self.plan` from now on).
            compressor: the wire's compressor (its dtype).
            prescale: the factor a block is multiplied by before it is reduced.
            postscale: the factor a reduced block is multiplied by (averaging).
            run: the blocks the engine runs in its place, where they differ (a sharded run's:
                plan/sharding.py); positions, forward-stage blocks and timings are of these.
        """
        runs = plan if run is None else run
        position = {b.block_id: i for i, b in enumerate(runs.blocks)}
        blocks = [_C.BlockSpec(
            block_id=block.block_id, op=int(block.op),
            wire_dtype=dtype_name(compressor.wire_dtype(getattr(torch, block.dtype))),
            # A reduce-scatter carries the prescale; its all-gather the postscale. A standalone
            # all-gather (top-k's entries) concatenates: nothing to scale.
            prescale=1.0 if block.op is Collective.ALL_GATHER else prescale,
            postscale=1.0 if block.op is Collective.REDUCE_SCATTER
            or (block.op is Collective.ALL_GATHER and block.source is None) else postscale,
            pieces=[_C.PieceSpec(tensor_id=p.tensor_id, offset=p.offset, numel=p.numel)
                    for p in block.pieces],
            released_by_caller=block.stage is Stage.FORWARD,
            source=-1 if block.source is None else position[block.source])
            for block in runs.blocks]
        self._engine.install_plan(blocks)
        self.plan = plan
        self._ops = [b.op.name.lower() for b in runs.blocks]
        self._forward_positions = [i for i, b in enumerate(runs.blocks) if b.stage is Stage.FORWARD]
        if self.timeline:
            self.timeline.mark(f"plan {plan.policy} {plan.fingerprint} ({len(plan.blocks)} blocks)")

    def not_ready(self) -> list[int]:
        return list(self._engine.not_ready_tensors())

    def progress(self) -> dict:
        """What the heartbeat publishes for the failure diagnosis and the stall inspector (called
        from its thread): the iteration the user sees, the round of waits the engine is in (the
        tensors not handed over yet are comparable across ranks in the same round), how long the
        training thread has been waiting on it, and those tensors."""
        since = self._engine.waiting_since_us
        return {"iteration": self._iteration(), "round": self.rounds, "label": self.label,
                "waiting_s": None if since < 0 else (_C.now_us() - since) / 1e6,
                "not_ready": [self.specs[t].name for t in self._engine.not_ready_tensors()]}

    @property
    def waited_s(self) -> float:
        """The training thread's total time blocked in engine waits (the engine keeps it)."""
        return self._engine.waited_us / 1e6

    def _failure(self, err: RuntimeError) -> RankFailureError:
        """A failed engine call, as raised to the user: starting with the ranks that hold this
        one up and how (world.liveness.diagnose: silent, left, or stuck where and how long).
        Its callers raise it `from None`: its text already holds the engine's error, which
        chained would print a second time with c10's C++ frames."""
        liveness = getattr(self._world, "liveness", None)
        verdict = liveness.diagnose(ranks=self._world.members).text if liveness is not None else ""
        text = without_backtrace(err)
        return self._world.fail(f"{verdict}: {text}" if verdict else text)

    def wait(self) -> None:
        """Waits for every block of the iteration, then records it for the profiler."""
        started = _C.now_us() if self.timeline else 0
        try:
            self._engine.wait_all(self.timeout_ms)
        except RuntimeError as err:
            raise self._failure(err) from None
        self.rounds += 1
        if self.sampling:
            engine = self._engine
            self.profiler.record(engine.last_ready_us(), engine.last_block_timings(), self._ops,
                                 engine.last_clocks())
        if self.sampling != ((self.rounds + 1) % self._sample_every == 0):
            self._arm_ready_events()
        if self.timeline:
            self.span("wait", started, what="all blocks")
            self.timeline.engine_events(self._engine.drain_events())

    def wait_block(self, position: int) -> None:
        started = _C.now_us() if self.timeline else 0
        try:
            self._engine.wait_block(position, self.timeout_ms)
        except RuntimeError as err:
            raise self._failure(err) from None
        if self.timeline:
            self.span("wait", started, what=f"block at position {position}")

    def span(self, name: str, started_us: int, **args: object) -> None:
        """A span of the training thread (lane 3) from `started_us` until now."""
        if self.timeline:
            self.timeline.span(name, 3, started_us, _C.now_us(), **args)

    def release_forward_blocks(self) -> None:
        """Releases every forward-stage block of the iteration (DeAR's all-gathers) at once,
        for synchronize(), which needs every gradient reduced now rather than layer by layer in
        the next forward pass. Only when nothing released any of them this iteration (the
        overlap runner is not open): a block released twice is an engine error."""
        for position in self._forward_positions:
            self.release(position)

    def reduced_shard(self, position: int) -> torch.Tensor:
        """This rank's summed slice of the reduce-scatter at `position`, once it completed."""
        self.wait_block(position)
        return self._engine.reduced_shard(position)

    def release(self, position: int) -> None:
        try:
            self._engine.release(position)
        except RuntimeError as err:
            raise self._failure(err) from None

    def set_credit(self, nbytes: int) -> None:
        self._engine.set_credit(nbytes)

    def mark(self, name: str) -> None:
        if self.timeline:
            self.timeline.mark(name)

    def shutdown(self) -> None:
        """Stops the engine's threads and destroys its group; a second call does nothing (an
        elastic re-form stops every engine before their sessions rebind, and a session's release
        and commsched.shutdown() may both come)."""
        if self._closed:
            return
        self._closed = True
        group, self._group = self._group, None
        if group is not None and dist.is_initialized():
            dist.destroy_process_group(group)
        # Python's last reference goes first, so that the group is destroyed inside
        # release_transport, without the GIL: Gloo's destructor joins its worker threads, and one
        # may be waiting for the GIL to free a tensor (a deadlock seen at K-FAC's shutdown).
        # release_transport stops the engine's threads itself: an engine that failed or still
        # has a collective in flight is retired off this thread (Note [Retiring a group] in
        # csrc/engine.cpp), which must never join a thread that waits on a peer.
        del group
        self._engine.release_transport()
        if self.timeline:
            self.timeline.engine_events(self._engine.drain_events())
            self.timeline.close()
        registry.unregister(self)

