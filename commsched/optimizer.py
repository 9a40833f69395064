"""commsched.DistributedOptimizer: Horovod's signature and semantics, commsched's engine.

Like Horovod, the wrapper is an instance of a class made on the fly that derives from the
user's optimizer class, so ``isinstance`` checks, LR schedulers and ``state_dict()`` keep working.
This module is Horovod's surface only: the wrapper, and ``StepProtocol``, the flags of Horovod's
synchronize()/step() protocol that say which step() reduces and when the wrapper warns. The run
itself (hooks, engine, plan, overlap) is the wrapper's ``session`` (commsched.runtime.session);
the update of a step GradScaler calls is grad_scaler.py's.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from . import _C
from .compression import NoneCompressor, from_config, resolve, split
from .config import load_config
from .grad_scaler import UNSCALE_BEFORE_SYNCHRONIZE, scaled_step
from .ops import Average, ReduceOp, resolve_op
from .params import refuse_data_parallel, resolve_groups, resolve_names
from .plan import Plan
from .runtime import checkpoint_entry as checkpoint
from .runtime.deferred import adopt_plain_attributes
from .runtime.modes import ModeKind
from .runtime.modes.shard_state import check_sharding_allowed, whole_state_dict
from .runtime.planning.auto.state import AutoState
from .runtime.session import Session
from .runtime.wrap import WrapOptions

_SHARDED_SYNCHRONIZE = (
    "commsched: synchronize() is not possible with shard_optimizer=True: each rank holds the "
    "averaged gradient of its own slice only, and step() updates the slices as they arrive. "
    "Clipping by global norm, GradScaler's unscale_() and K-FAC need every gradient whole.")


_STEP_AFTER_SYNCHRONIZE = (
    "optimizer.step() called without optimizer.skip_synchronize() context after "
    "optimizer.synchronize(). This can cause training slowdown. You may want to consider using "
    "optimizer.skip_synchronize() context if you use optimizer.synchronize() in your code.")
_ZERO_GRAD_DROPS_ACCUMULATION = (
    "commsched: zero_grad() drops gradients accumulated under no_sync() that were never "
    "averaged or applied (the last backward pass ran inside no_sync(), as at the end of an epoch "
    "whose micro-batches do not fill a whole step). To keep them, call optimizer.step() before "
    "zero_grad(): it averages what was accumulated and steps.")
_ZERO_GRAD_PENDING = (
    "optimizer.zero_grad() was called after loss.backward() but before optimizer.step() or "
    "optimizer.synchronize(). This is prohibited as it can cause a race condition.")


class StepProtocol:
    """The flags of Horovod's synchronize()/step() protocol, and what step() does with them."""

    def __init__(self, native_amp_scaling: bool) -> None:
        """Starts outside skip_synchronize(), with nothing synchronized.

        Args:
            native_amp_scaling: whether the user's optimizer reads GradScaler's ``grad_scale``
                and ``found_inf`` itself (fused Adam).
        """
        self.should_synchronize = True  # False inside skip_synchronize()
        self.synchronized = False  # synchronize() ran since the last step()
        # Note [GradScaler asks before it unscales]: whether the last synchronize() was the
        # scaler's, and whether the user's optimizer unscales by itself (fused Adam).
        self.synchronized_for_scaler = False
        self.native_amp_scaling = native_amp_scaling

    @property
    def reduces(self) -> bool:
        """Whether step() is to reduce the gradients itself (no synchronize() was called)."""
        return self.should_synchronize and not self.synchronized

    def after_synchronize(self) -> None:
        """Records an explicit synchronize(): the next step() steps on its gradients."""
        self.synchronized = True
        self.synchronized_for_scaler = False

    def before_scaler(self, synchronize: Callable[[], None]) -> None:
        """GradScaler asks before it reads a gradient: reduce them first, for the scaler."""
        if self.reduces:
            synchronize()
            self.synchronized_for_scaler = True

    @contextlib.contextmanager
    def skipping(self) -> Iterator[None]:
        """The block of skip_synchronize(): step() uses the gradients as they are."""
        self.should_synchronize = False
        try:
            yield
        finally:
            self.should_synchronize = True

    def before_update(self, synchronize: Callable[[], None]) -> None:
        """What a synchronous step() does before the update: reduce, unless skipped.

        Horovod's warning where synchronize() already reduced outside skip_synchronize().
        """
        if self.should_synchronize:
            if self.synchronized:
                warnings.warn(_STEP_AFTER_SYNCHRONIZE, stacklevel=3)  # step()'s caller
            synchronize()
        self.synchronized = False

    def before_zero_grad(self, session: Session) -> None:
        """Horovod's rule for zero_grad(): not while gradients are being reduced in place.

        It also warns where zero_grad() drops gradients accumulated under no_sync() and never
        averaged.
        """
        accumulation = session.accumulation
        if accumulation.pending:  # never while passing through: no hook hands a gradient over
            raise AssertionError(_ZERO_GRAD_PENDING)
        if session.state.held_back:
            session.state.held_back = False
            warnings.warn(_ZERO_GRAD_DROPS_ACCUMULATION, stacklevel=3)  # zero_grad()'s caller

    def scaled_step(self, optimizer: torch.optim.Optimizer, session: Session,
                    closure: Any) -> Any:
        """step() called by GradScaler (Note [GradScaler asks before it unscales])."""
        if vars(optimizer)["grad_scale"] is None and self.synchronized_for_scaler:
            self.synchronized = False
            raise RuntimeError(UNSCALE_BEFORE_SYNCHRONIZE)
        if self.should_synchronize and self.synchronized and not self.synchronized_for_scaler:
            warnings.warn(_STEP_AFTER_SYNCHRONIZE, stacklevel=3)  # the scaler, step()'s caller
        self.synchronized = False
        return scaled_step(optimizer, session, self.native_amp_scaling, closure)


# Note [zero_grad after a deferred step]
# Under an overlap plan, step() took every gradient out of p.grad (the runner holds
# them until their update in the next forward pass), so the zero_grad() of a training
# loop finds nothing to clear; torch's own still costs a profiler range and a loop over
# the parameters (a few percent of the built-in MLP's iteration on this project's CPU;
# figures: benchmarks/notes/README.md, 'zero_grad after a deferred step'). It is left
# out whenever it could change nothing: no parameter has a gradient (one C++ pass over
# the param groups, which stops at the first gradient it finds) and the optimizer class
# keeps torch's zero_grad.


class _DistributedOptimizer(torch.optim.Optimizer):
    """The wrapper's methods, mixed in front of the user's optimizer class.

    Its own attributes: ``session`` (the run) and ``_cs_protocol``, the flags of Horovod's
    synchronize()/step() protocol (StepProtocol, above). DistributedOptimizer makes the class;
    users never name it.
    """

    session: Session

    def _cs_setup(self, session: Session, native_amp_scaling: bool) -> None:
        self.session = session
        self._cs_protocol = StepProtocol(native_amp_scaling)
        # See Note [zero_grad after a deferred step] (above the class).
        self._cs_torch_zero_grad = session.base_cls.zero_grad is torch.optim.Optimizer.zero_grad

    @property
    def plan(self) -> Plan:
        """The plan the engine runs now: its policy, blocks and fingerprint.

        Each block is the gradients (or partitions of them) fused into one collective, in the
        order they go. During the first ``profile_steps`` steps it is the profiling plan (one
        collective per tensor); the policy's own plan replaces it after them and at each re-plan
        (docs/policies.md, "Profiling and planning"). Read it to see what a policy does with
        your model; it is the same on every rank.

        Raises:
            RuntimeError: in an elastic Horovod job before the first step, where the plan is
                made with the world of that step.
        """
        return self.session.plan

    @property
    def _parameter_names(self) -> dict[torch.Tensor, str]:
        """Horovod's private {parameter: name} map, which Horovod's own tests read.

        With no named_parameters the names are generated, unique and equal on every rank.
        """
        return dict(self.session.names)

    @property
    def auto(self) -> AutoState | None:
        """What policy ``auto`` chose and how its prediction held up; None under other policies.

        ``auto.summary()`` gives the choice, its knobs, the predicted and measured iteration
        times, whether it re-planned and the ranking of every candidate; ``auto.history`` holds
        one entry per plan it installed and what it measured (docs/policies.md, "auto"). Like
        ``plan``, it raises RuntimeError in an elastic Horovod job before the first step.
        """
        _ = self.session.plan  # the check for an elastic job's first step
        return self.session.lifecycle.auto

    @property
    def plan_settled(self) -> bool:
        """Whether the plan that stays runs now; time steady steps after it turns True.

        Profiling, the re-plan from the policy's own iterations and ``auto``'s trials are over.
        False in an elastic Horovod job before the first step, which makes the plan.
        """
        return self.session.bound and self.session.lifecycle.sampling.settled

    @property
    def backward_passes_per_step(self) -> int:
        """Backward passes summed locally before one reduction (assigning it checks the value)."""
        return self.session.accumulation.passes

    @backward_passes_per_step.setter
    def backward_passes_per_step(self, passes: int) -> None:
        self.set_backward_passes_per_step(passes)

    def synchronize(self) -> None:
        """Reduces this iteration's gradients into ``p.grad`` and waits until every one is there.

        A gradient this rank did not produce counts as zeros, as in Horovod. Call it where the
        averaged gradients are needed before the update: to clip by global norm, to
        ``scaler.unscale_()`` under a GradScaler (Horovod's recipe), or to precondition them
        (K-FAC); then call step() inside skip_synchronize(), or it reduces again and warns.
        Under an overlap plan it first applies the updates still pending (as flush() does), and
        the gradients are final when it returns instead of in the next forward pass.

        Raises:
            RankFailureError: a collective failed or timed out (COMMSCHED_TIMEOUT); the message
                names the ranks that hold this one up and how (docs/failures.md).
            MismatchError: the ranks built different plans (compared before a new plan's first
                collective).
        """
        if self.session.sharded is not None:
            raise RuntimeError(_SHARDED_SYNCHRONIZE)
        self._cs_synchronize()

    def _cs_synchronize(self) -> None:
        self.session.synchronize()
        self._cs_protocol.after_synchronize()

    # Note [GradScaler asks before it unscales] (grad_scaler.py)
    @property
    def _step_supports_amp_scaling(self) -> bool:
        self._cs_protocol.before_scaler(self.synchronize)
        return True

    def flush(self) -> None:
        """Applies every update still pending from an overlap plan, so the parameters are current.

        Under bytescheduler, prophet and dear (or ``auto``'s choice of one) step() leaves each
        update to the next forward pass. Call flush() where the training loop stops for a while
        (an evaluation, a checkpoint) or before reading parameters some other way (``p.data``, a
        ``model.load_state_dict()`` mid-run): the profile then also leaves that stop out of the
        next iteration's compute. synchronize(), state_dict(), load_state_dict(), any module's
        state_dict() and commsched.shutdown() flush by themselves. Under a synchronous plan
        nothing is pending.

        Raises:
            RankFailureError: a block the pending updates wait for failed or timed out.
        """
        self.session.flush(pause=True)

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Makes step() use the gradients as they are, after an explicit synchronize().

        Horovod's protocol: ``optimizer.synchronize()``, work on the averaged gradients
        (clipping, ``scaler.unscale_()``, K-FAC), then ``optimizer.step()`` (or
        ``scaler.step(optimizer)``) inside this block, which neither reduces again nor warns.
        step() inside the block does not reduce at all, so call synchronize() before it.

        Yields:
            Nothing; the block runs the step.
        """
        with self._cs_protocol.skipping():
            yield

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Gradient accumulation, as DDP's ``no_sync()``, under every policy.

        Backward passes inside the block accumulate their gradients locally in ``p.grad`` and
        send nothing; the next backward pass outside it adds its own and hands over the sum,
        which is averaged as usual at step() (Note [Accumulating without sending] in
        csrc/gradient_intake.cpp). Run every micro-batch but the last inside the block, the last
        outside it, then step(). If the last backward pass ran inside the block (an epoch's
        end), step() still averages what accumulated, while zero_grad() drops it with a
        warning. Nested blocks count as one; in a world of one there is nothing to hold back.

        Yields:
            Nothing; the block runs the micro-batches whose gradients accumulate.

        Raises:
            RuntimeError: a backward pass outside the block already sent gradients of this
                iteration (step() has not been called since): they are being averaged in place
                in ``p.grad``, where the block would accumulate.
        """
        with self.session.accumulation.no_sync(self.session.mode.kind is ModeKind.PLAIN):
            yield

    def step(self, closure: Any = None) -> Any:
        """Completes the iteration's reduction and updates the parameters with your optimizer.

        Under a synchronous plan (horovod, ddp, mgwfbp) it launches the gradients this rank did
        not produce (as zeros), waits for every block and runs your optimizer's own step. Under
        an overlap plan (bytescheduler, prophet, dear) it launches what is left and returns: each
        parameter's update is applied in the next forward pass, before the first module that
        uses it, by your optimizer with its own state and hyper-parameters (docs/policies.md).
        Inside skip_synchronize() it steps on the gradients as synchronize() left them.

        ``scaler.step(optimizer)`` of torch.amp.GradScaler works under every policy, in DDP's
        recipe and in Horovod's (Note [GradScaler asks before it unscales]): the scaler checks
        the averaged gradients, so an overflow on any rank skips the update on every rank, and
        under an overlap plan a scaled update is made here, at step().

        Args:
            closure: re-evaluates the model and returns the loss, as for torch's step(); not
                possible where the update is deferred to the next forward pass.

        Returns:
            What your optimizer's step returns (the closure's loss, or None); None where the
            update is deferred or skipped after an overflow.

        Raises:
            ValueError: a closure under an overlap plan, which defers the update.
            RuntimeError: ``scaler.unscale_(optimizer)`` read the gradients before
                synchronize() averaged them; the message names the two recipes that work.
            RankFailureError: a collective failed or timed out (COMMSCHED_TIMEOUT).
            MismatchError: the ranks built different plans.

        Warns:
            UserWarning: synchronize() was called before step() outside skip_synchronize()
                (Horovod's warning): the gradients are reduced a second time.
        """
        if "found_inf" in vars(self):  # GradScaler set it for this call
            return self._cs_protocol.scaled_step(self, self.session, closure)
        session = self.session
        if session.binding.elastic and session.elastic_guard.state_step:  # Horovod's state sync
            return super().step(closure)
        return session.mode.step(self, self._cs_protocol, self._cs_synchronize, closure)

    def _cs_local_step(self) -> Any:
        # Note [local step] in commsched.world.broadcast
        """The user optimizer's own step, with no reduction, on the calling rank only."""
        return super().step()

    def state_dict(self) -> dict[str, Any]:
        """Returns your optimizer's state plus a ``commsched`` entry to resume the run from.

        The entry holds the policy, the installed plan, the iteration, whether profiling and
        re-planning are still to come, ``auto``'s bookkeeping and a lossy compressor's state.
        It is made of plain values and tensors, so ``torch.load(..., weights_only=True)`` reads
        it, and a plain torch optimizer ignores it when it loads the state. Updates still
        pending from an overlap plan are applied first, so the state matches the parameters.
        In an elastic Horovod job before the first step there is no plan and no entry.

        Returns:
            torch's ``state`` and ``param_groups``, and ``commsched`` (see docs/usage.md,
            "Checkpoints").
        """
        # Not a pause: some loops save every step (Note [A pause is not compute]).
        self.session.flush()
        return checkpoint.save(self.session,
                               whole_state_dict(self, self.session.sharded, super().state_dict))

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Loads your optimizer's state, and the plan and iteration in its ``commsched`` entry.

        With the entry a resumed job runs the saved plan at once instead of profiling again, and
        continues bit for bit. Call it on every rank, or on rank 0 followed by
        broadcast_optimizer_state(); it starts no collective (the ranks compare what they
        restored before the next one). A state without the entry (a plain optimizer's) loads as
        torch loads it, and the run keeps profiling and planning as it would have. Updates still
        pending from an overlap plan are applied first.

        Args:
            state_dict: what state_dict() of a wrapped optimizer (or of a plain one of the same
                class and parameters) returned.

        Raises:
            ValueError: the entry does not fit this wrapper: another entry version, another
                policy, other tensors, lossy compression on one side only, or an overlap plan
                while this wrapper has no ``model=``; the message names the difference and that
                dropping the entry profiles and plans afresh. torch raises ValueError too for
                param groups that do not match.
        """
        checkpoint.load(self.session, state_dict, super().load_state_dict)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clears the gradients, as your optimizer's own method does.

        Args:
            set_to_none: set ``p.grad`` to None rather than to zeros, as in torch.

        Raises:
            AssertionError: called after ``loss.backward()`` handed gradients over and before
                step() or synchronize() (Horovod's rule): the engine is still reducing them in
                place in ``p.grad``.

        Warns:
            UserWarning: gradients accumulated under no_sync() were never averaged or applied
                (the last backward pass ran inside the block) and are dropped; call step()
                before zero_grad() to keep them.
        """
        self._cs_protocol.before_zero_grad(self.session)
        # Note [zero_grad after a deferred step] (above the class)
        if self._cs_torch_zero_grad and _C.no_grads(self.param_groups):
            return
        super().zero_grad(set_to_none=set_to_none)

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Sets how many backward passes are summed locally before one reduction, as Horovod's.

        Each gradient goes to the engine after its `passes`-th backward pass, and step() is
        called once per `passes` backward passes. Call it between iterations, on every rank:
        the count starts again from zero.

        Args:
            passes: backward passes per step, at least 1.

        Raises:
            ValueError: `passes` is not positive.
        """
        if passes <= 0:
            raise ValueError(f"backward_passes_per_step must be > 0, got {passes}")
        self.session.set_passes(passes)


def DistributedOptimizer(  # Horovod's name: called like a class
        optimizer: torch.optim.Optimizer,
        named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
        compression: Any = None,
        backward_passes_per_step: int = 1,
        op: Any = Average,
        gradient_predivide_factor: float = 1.0,
        num_groups: int = 0,
        groups: Any = None,
        sparse_as_dense: bool = False,
        process_set: Any = None,
        model: torch.nn.Module | None = None,
        policy: str | None = None,
        **knobs: Any) -> _DistributedOptimizer:
    """Wraps `optimizer` so that gradients are averaged across ranks by commsched's engine.

    Horovod's ``hvd.DistributedOptimizer``, called the same way and with the same semantics: the
    result is an instance of a class made on the fly that derives from ``type(optimizer)``, so
    ``isinstance`` checks, LR schedulers and ``state_dict()`` keep working. It shares
    `optimizer`'s param groups and state; use it in place of `optimizer` from then on. Every rank
    wraps at the same point of its program, with the same parameters and settings; the wrap
    joins the world (init()) if nothing did yet.

    During ``loss.backward()`` each gradient goes to the engine as soon as it is accumulated,
    and the policy's plan decides which gradients are fused into one collective and in which
    order they go. The first ``profile_steps`` steps profile; then every rank builds the same
    plan from the world's profile (docs/policies.md). A dropped wrapper releases its engine's
    threads and process groups. Models compiled with ``torch.compile`` run under every policy
    (Note [Module hooks under torch.compile] in runtime/modes/overlap/runner.py).

    Args:
        optimizer: the torch optimizer to wrap; it keeps its param groups, hyper-parameters and
            state, and its own step() makes every update.
        named_parameters: ``model.named_parameters()``: names for the gradients, in the order
            the model declares them, which the planners take for the forward order. Names must
            be unique and cover every parameter of `optimizer`. None: generated names
            (``allreduce.noname.<i>``) in the optimizer's order.
        compression: a cast on the wire (``Compression.none``, ``Compression.fp16``,
            ``Compression.bf16``, or Horovod's ``hvd.Compression.none`` / ``fp16``) or a lossy
            compressor with error feedback (``Compression.powersgd(...)``,
            ``Compression.topk(...)``). A string is the knob's value (``"fp16"``, ``"topk"``;
            its parameters as knobs: ``topk_ratio=0.01``), as ``--knob compression=fp16`` in
            the examples passes it. None: what COMMSCHED_COMPRESSION names (none unless set).
        backward_passes_per_step: backward passes summed locally before one reduction
            (Horovod's accumulation; no_sync() is DDP's way to do the same).
        op: ``Average`` (the mean over ranks) or ``Sum``; Horovod's ``hvd.Average`` and
            ``hvd.Sum`` are accepted too.
        gradient_predivide_factor: with ``op=Average``, gradients are divided by this factor
            before the sum and by ``size() / factor`` after it, as in Horovod (to keep
            half-precision sums in range).
        num_groups: Horovod's deprecated spelling of an integer `groups` (warns).
        groups: an integer splits the parameters into that many groups of consecutive
            parameters; a list of lists of tensors names the groups. The gradients of one group
            (and one dtype) always travel together, in one block. 0 or None: the policy alone
            decides what is fused.
        sparse_as_dense: reduce the sparse gradients of ``sparse=True`` embeddings as dense
            tensors (handed back sparse) instead of all-gathering their rows (docs/usage.md,
            "Sparse gradients").
        process_set: an ``hvd.ProcessSet`` or a list of global ranks: gradients are averaged
            within the set only, and a rank outside it steps on its own gradients. Only the
            members need to wrap, except in an elastic Horovod job, where the set is read
            again in each re-formed world and every rank wraps.
        model: the model whose forward pass commsched may hook; pass the compiled module when
            the model is compiled. The overlap policies (bytescheduler, prophet, dear) need it,
            because they apply each update in the next forward pass; ``auto`` considers them
            only with it; sparse gradients of ``sparse=True`` modules are all-gathered only with
            it. A model compiled with ``fullgraph=True`` forbids the graph breaks those hooks
            make: the overlap policies are refused and ``auto`` plans synchronous policies only.
        policy: the scheduling policy: ``horovod`` (default), ``ddp``, ``mgwfbp``,
            ``bytescheduler``, ``prophet``, ``dear`` or ``auto``; it overrides COMMSCHED_POLICY
            (docs/policies.md). None: the knob's other sources decide.
        **knobs: any other knob by its lower-case name (``fusion_threshold="64MiB"``,
            ``timeout=600``), ahead of its environment variable and YAML key in the knobs'
            precedence (README, "Knobs"); None leaves a knob to its other sources.

    Returns:
        The wrapper, an instance of a subclass of ``type(optimizer)``: Horovod's synchronize(),
        skip_synchronize() and set_backward_passes_per_step(), and no_sync(), flush(), ``plan``
        and ``auto`` (docs/api.md lists them).

    Raises:
        TypeError: `optimizer` is not a ``torch.optim.Optimizer``.
        ValueError: an argument Horovod refuses (backward_passes_per_step not a positive
            integer, ``op=Adasum`` or no reduction op, gradient_predivide_factor not positive or
            not 1 with ``op=Sum``, named_parameters with duplicate or missing names, malformed
            groups, a process_set with ranks outside the world); `model`, or the module of
            the parameters, wrapped in torch's DistributedDataParallel (it would reduce every
            gradient a second time: drop one of the two); an overlap policy without `model`,
            with a model compiled with ``fullgraph=True``, or with an optimizer that needs
            every gradient at once (LBFGS); in an elastic Horovod job, shard_optimizer=True.
        ConfigError: a knob's value is not allowed, or a keyword argument, ``COMMSCHED_*``
            variable or YAML key is unknown; the message names the source and what is allowed.
        MismatchError: the ranks wrap different parameters (names, shapes, dtypes) or settings.
        RuntimeError: torch.distributed's own error where a peer fails while the ranks compare
            their wraps or make the engine's process group.
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer)!r}")
    if isinstance(backward_passes_per_step, bool) or not isinstance(backward_passes_per_step, int) \
            or backward_passes_per_step <= 0:
        raise ValueError(f"backward_passes_per_step must be > 0, got {backward_passes_per_step!r}")
    reduce_op = resolve_op(op)
    if gradient_predivide_factor != 1.0 and reduce_op is not ReduceOp.AVERAGE:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if not gradient_predivide_factor > 0:
        raise ValueError(f"gradient_predivide_factor must be > 0, got {gradient_predivide_factor}")
    if isinstance(compression, str):  # the knob's value, its parameters knobs too
        knobs, compression = {**knobs, "compression": compression}, None
    config = load_config({**knobs, "policy": policy})
    named = resolve_names(optimizer, named_parameters)
    refuse_data_parallel(model, [p for _, p in named])
    group_of = resolve_groups([p for _, p in named if p.requires_grad], num_groups, groups)
    cls = type(optimizer.__class__.__name__, (_DistributedOptimizer, optimizer.__class__), {})
    wrapped: _DistributedOptimizer = object.__new__(cls)
    torch.optim.Optimizer.__init__(wrapped, optimizer.param_groups, optimizer.defaults)
    wrapped.state = optimizer.state
    adopt_plain_attributes(wrapped, optimizer)
    cast, lossy = split(from_config(config) if compression is None else resolve(compression))
    if config.shard_optimizer:
        check_sharding_allowed(config.policy.value, optimizer.__class__,
                               lossy is not None or cast is not NoneCompressor, process_set)
    options = WrapOptions(cast, backward_passes_per_step, reduce_op,
                          float(gradient_predivide_factor), group_of, sparse_as_dense, model,
                          lossy=lossy, process_set=process_set)
    native_amp_scaling = bool(getattr(optimizer, "_step_supports_amp_scaling", False))
    wrapped._cs_setup(Session(wrapped, optimizer.__class__, named, options, config),
                      native_amp_scaling)
    if lossy is not None:  # top-k's momentum correction (runtime/compression/dgc_momentum.py)
        wrapped.session.binding.correct_momentum(wrapped, average=reduce_op is ReduceOp.AVERAGE)
    return wrapped
