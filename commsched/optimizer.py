"""commsched.DistributedOptimizer: Horovod's signature and semantics, commsched's engine.

Like Horovod, the wrapper is an instance of a class made on the fly that derives from the
user's optimizer class, so ``isinstance`` checks, LR schedulers and ``state_dict()`` keep working.
Gradients are handed to the engine from post-accumulate-grad hooks as they are produced; the
engine launches the plan's blocks in order on its own threads; ``synchronize()`` waits.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from . import _C, bootstrap, checkpoint
from .auto import AutoState
from .block_optimizer import adopt_plain_attributes
from .compression import Compression, Compressor, resolve
from .config import Config, Policy, load_config
from .consistency import check_identical, parameter_signature
from .engine import EngineHandle
from .ops import Average, ReduceOp, resolve_op
from .overlap import OverlapRunner
from .params import make_specs, resolve_groups, resolve_names
from .plan import NetModel, Plan, Profile, TensorSpec, make_plan, make_profiling_plan
from .profiler import profile_document
from .sparse import SparseExchange, sparse_parameter_ids, unrouted_sparse_error

log = logging.getLogger("commsched")

_STEP_AFTER_SYNCHRONIZE = (
    "optimizer.step() called without optimizer.skip_synchronize() context after "
    "optimizer.synchronize(). This can cause training slowdown. You may want to consider using "
    "optimizer.skip_synchronize() context if you use optimizer.synchronize() in your code.")
_TOO_MANY_BACKWARDS = (
    "Gradients were computed more than backward_passes_per_step times before call to step(). "
    "Increase backward_passes_per_step to accumulate gradients locally.")
_ZERO_GRAD_PENDING = (
    "optimizer.zero_grad() was called after loss.backward() but before optimizer.step() or "
    "optimizer.synchronize(). This is prohibited as it can cause a race condition.")


class _DistributedOptimizer(torch.optim.Optimizer):
    """Mixed in front of the user's optimizer class; attributes are prefixed ``_cs_``."""

    _cs_engine: EngineHandle
    _cs_params: list[torch.Tensor]
    _cs_specs: list[TensorSpec]
    _cs_config: Config

    def _cs_setup(self, named: list[tuple[str, torch.Tensor]], compression: type[Compressor],
                  backward_passes_per_step: int, op: ReduceOp, predivide: float,
                  group_of: dict[int, int], sparse_as_dense: bool, model: Any,
                  config: Config, base_cls: type[torch.optim.Optimizer]) -> None:
        world = bootstrap.init(config.timeout)
        self._cs_world = world
        self._cs_config = config
        self._cs_compression = compression
        self._cs_op = op
        self._cs_sparse_as_dense = sparse_as_dense
        self._cs_model = model
        self._cs_base_cls = base_cls
        self._cs_should_synchronize = True
        self._cs_synchronized = False
        self._cs_iteration = 0
        self._cs_step_end_us = -1
        self._cs_waited_at_step_end = 0.0
        self._cs_first_hook_seen = False
        self.backward_passes_per_step = backward_passes_per_step
        routed_ids = sparse_parameter_ids(model, sparse_as_dense)
        routed = [(n, p) for n, p in named if p.requires_grad and id(p) in routed_ids]
        tracked = [(n, p) for n, p in named if p.requires_grad and id(p) not in routed_ids]
        self._cs_params = [p for _, p in tracked]
        self._cs_specs = make_specs(tracked, group_of)
        self._cs_delay = [backward_passes_per_step] * len(self._cs_specs)
        self._cs_prescale = 1.0 / predivide
        self._cs_postscale = predivide / world.size if op is ReduceOp.AVERAGE else 1.0
        check_identical(world, "wrapped parameters (name, shape, dtype)",
                        parameter_signature(self._cs_specs, [tuple(p.shape) for p in self._cs_params]))
        settings = {**config.as_dict(), "timeline": None, "compression": compression.__name__,
                    "op": op.name, "backward_passes_per_step": backward_passes_per_step,
                    "gradient_predivide_factor": predivide,
                    "groups": [s.group for s in self._cs_specs],
                    "sparse": [[n, list(p.shape), str(p.dtype)] for n, p in routed]}
        check_identical(world, "commsched settings", sorted(settings.items()))
        self._cs_sparse = SparseExchange(world, routed, op, backward_passes_per_step)
        self._cs_engine = EngineHandle(world, self._cs_specs, config.timeout, config.timeline)
        self._cs_set_credit(config.credit_bytes)
        self._cs_check_restored = False
        self._cs_runner = None
        if config.policy.overlaps_iterations:
            check_overlap_allowed(config.policy, model, base_cls)
        self.auto: AutoState | None = None
        if config.policy is Policy.AUTO:
            self.auto = AutoState()
        if config.policy.overlaps_iterations or (self.auto and overlap_possible(model, base_cls)):
            assert model is not None
            self._cs_runner = OverlapRunner(self, base_cls, model, self._cs_params, self._cs_engine)
        self._cs_last_end: float | None = None
        self._cs_replan_at, first_plan = self._cs_first_plan()
        self._cs_install(first_plan)
        if self._cs_replan_at is None and self._cs_runner is not None:
            self._cs_runner.activate(first_plan)
        self._cs_hooks = [p.register_post_accumulate_grad_hook(self._cs_make_hook(tid))
                          for tid, p in enumerate(self._cs_params) if p.numel() > 0]
        self._cs_hooks += [p.register_post_accumulate_grad_hook(self._cs_make_sparse_hook(i))
                           for i, p in enumerate(self._cs_sparse.params)]

    # -- planning ---------------------------------------------------------------------------

    def _cs_first_plan(self) -> tuple[int | None, Plan]:
        """The plan for the first iterations and the iteration after which to re-plan."""
        cfg = self._cs_config
        if cfg.policy is Policy.DDP:
            return 1, make_plan(cfg.policy, self._cs_specs, Profile(), NetModel(), cfg)
        if cfg.profile_steps > 0:
            return cfg.profile_steps, make_profiling_plan(self._cs_specs, Profile(), cfg.policy)
        if cfg.policy is Policy.AUTO:
            raise ValueError("commsched: policy 'auto' chooses from a profile: "
                             "COMMSCHED_PROFILE_STEPS (profile_steps) must be > 0")
        # Nothing profiled yet: the profiler's default cost model with the configured overrides.
        net = self._cs_engine.profiler.net_model(cfg.alpha, cfg.beta)
        return None, make_plan(cfg.policy, self._cs_specs, Profile(), net, cfg)

    def _cs_replan(self) -> None:
        """Builds the policy's plan from rank 0's profile, identically on every rank."""
        cfg = self._cs_config
        if self.auto is not None:
            self._cs_replan_auto()
            return
        profiler = self._cs_engine.profiler
        profile, net = self._cs_world.broadcast_object(
            (profiler.profile(), profiler.net_model(cfg.alpha, cfg.beta)))
        plan = make_plan(cfg.policy, self._cs_specs, profile, net, cfg)
        self._cs_write_profile()
        log.info("commsched: rank %d installs %s plan %s: %d blocks (alpha=%.3g s, beta=%.3g s/B)",
                 self._cs_world.rank, plan.policy, plan.fingerprint, len(plan.blocks), net.alpha,
                 net.beta)
        self._cs_install(plan)
        if self._cs_runner is not None:
            self._cs_runner.activate(plan)

    def _cs_replan_auto(self) -> None:
        """Simulates every valid plan on rank 0's profile and installs the fastest."""
        assert self.auto is not None
        if self._cs_runner is not None and self._cs_runner.open:
            self._cs_runner.finish()  # the engine must be idle before its plan changes
        document = self._cs_world.broadcast_object(self._cs_profile_document())
        chosen = self.auto.choose(document, self._cs_config, self._cs_runner is not None)
        self._cs_write_profile(document)
        self._cs_install(chosen.plan)
        self._cs_set_credit(int(chosen.knobs.get("credit_bytes", self._cs_config.credit_bytes)))
        if self._cs_runner is not None:
            if chosen.policy.overlaps_iterations:
                self._cs_runner.activate(chosen.plan)
            else:
                self._cs_runner.deactivate()

    def _cs_profile_document(self) -> dict:
        modules = self._cs_runner.modules if self._cs_runner else None
        return profile_document(self._cs_specs, self._cs_engine.profiler, self._cs_world.size,
                                modules.order if modules else [], modules.times if modules else {},
                                self._cs_runner.first_users() if self._cs_runner else None)

    def _cs_write_profile(self, document: dict | None = None) -> None:
        path = self._cs_config.profile
        if not path or self._cs_world.rank != 0:
            return
        doc = document if document is not None else self._cs_profile_document()
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(doc, handle, indent=1)

    def _cs_install(self, plan: Plan) -> None:
        check_identical(self._cs_world, "plan fingerprints", [plan.policy, plan.fingerprint])
        self._cs_install_local(plan)

    def _cs_install_local(self, plan: Plan) -> None:
        self._cs_engine.install(plan, self._cs_compression, self._cs_prescale, self._cs_postscale)

    def _cs_set_credit(self, nbytes: int) -> None:
        self._cs_credit = nbytes  # kept for checkpoints: `auto` may have chosen another credit
        self._cs_engine.set_credit(nbytes)

    def _cs_settle(self) -> None:
        """After load_state_dict() changed the plan or the position, every rank compares them
        before the first collective of the next iteration (see commsched.checkpoint)."""
        if self._cs_check_restored:
            self._cs_check_restored = False
            check_identical(self._cs_world, "plans restored by load_state_dict() (policy, "
                            "fingerprint, iteration, re-plan iteration)",
                            [self.plan.policy, self.plan.fingerprint, self._cs_iteration,
                             self._cs_replan_at])

    @property
    def plan(self) -> Plan:
        """The plan the engine runs now."""
        assert self._cs_engine.plan is not None
        return self._cs_engine.plan

    # -- gradient hooks -----------------------------------------------------------------------

    def _cs_hook_prologue(self) -> None:
        self._cs_settle()
        if self._cs_runner is not None and self._cs_runner.open:
            # No forward pass of `model` closed the previous iteration: do it now.
            self._cs_runner.finish()
        if not self._cs_first_hook_seen:
            self._cs_first_hook_seen = True
            self._cs_note_compute_before_backward()

    def _cs_make_hook(self, tensor_id: int):  # noqa: ANN202 - autograd hook
        def hook(param: torch.Tensor) -> None:
            self._cs_hook_prologue()
            remaining = self._cs_delay[tensor_id]
            if remaining <= 0:
                raise AssertionError(_TOO_MANY_BACKWARDS)
            if param.grad is None:
                return
            if param.grad.is_sparse:
                if not self._cs_sparse_as_dense:
                    raise unrouted_sparse_error(self._cs_specs[tensor_id].name,
                                                self._cs_model is not None)
                param.grad = param.grad.to_dense()
            self._cs_delay[tensor_id] = remaining - 1
            if remaining == 1:
                self._cs_engine.mark_ready(tensor_id, _dense_layout(param))
        return hook

    def _cs_make_sparse_hook(self, index: int):  # noqa: ANN202 - autograd hook
        def hook(param: torch.Tensor) -> None:
            # The gradient stays in p.grad until the exchange at synchronize()/step().
            self._cs_hook_prologue()
            delay = self._cs_sparse.delay
            if delay[index] <= 0:
                raise AssertionError(_TOO_MANY_BACKWARDS)
            if param.grad is not None:
                delay[index] -= 1
        return hook

    def _cs_note_compute_before_backward(self) -> None:
        """From the end of the last step() to this iteration's first gradient, minus the time the
        training thread spent waiting on the engine (overlap mode waits in the forward pass):
        the compute the simulator needs before backward produces gradients."""
        if self._cs_step_end_us < 0:
            return
        engine = self._cs_engine
        elapsed = (_C.now_us() - self._cs_step_end_us) / 1e6
        engine.profiler.note("before_first_ready_s",
                             max(elapsed - (engine.waited_s - self._cs_waited_at_step_end), 0.0))

    @property
    def _cs_pending(self) -> bool:
        passes = self.backward_passes_per_step
        return any(d != passes for d in self._cs_delay) or self._cs_sparse.pending(passes)

    # -- Horovod's public surface ---------------------------------------------------------------

    def _cs_launch_rest(self) -> None:
        """Marks every gradient not produced on this rank as ready, as zeros (Horovod's rule:
        another rank may have computed it)."""
        engine = self._cs_engine
        for tensor_id in engine.not_ready():
            param = self._cs_params[tensor_id]
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            elif param.grad.is_sparse:
                param.grad = param.grad.to_dense()
            engine.mark_ready(tensor_id, _dense_layout(param))

    def _cs_end_iteration(self) -> None:
        self._cs_delay = [self.backward_passes_per_step] * len(self._cs_specs)
        self._cs_sparse.reset(self.backward_passes_per_step)
        self._cs_first_hook_seen = False
        self._cs_iteration += 1
        self._cs_engine.mark(f"iteration {self._cs_iteration}")
        now = time.perf_counter()
        if self.auto is not None and self._cs_last_end is not None \
                and self.auto.record(now - self._cs_last_end):
            measured = self._cs_world.broadcast_object(self.auto.local_median())
            if self.auto.conclude(measured):
                self._cs_replan()
        self._cs_last_end = time.perf_counter()
        if self._cs_iteration == self._cs_replan_at:
            self._cs_replan()

    def synchronize(self) -> None:
        """Reduces every gradient into ``p.grad``; missing ones count as zeros, as in Horovod."""
        self.flush()
        self._cs_settle()
        self._cs_launch_rest()
        self._cs_sparse.exchange()  # while the engine's thread reduces the dense blocks
        self._cs_engine.wait()
        self._cs_end_iteration()
        self._cs_synchronized = True

    def flush(self) -> None:
        """Applies every update still pending from cross-iteration overlap."""
        if self._cs_runner is not None:
            self._cs_runner.finish()

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        self._cs_should_synchronize = False
        try:
            yield
        finally:
            self._cs_should_synchronize = True

    def step(self, closure: Any = None) -> Any:
        runner = self._cs_runner
        if self._cs_should_synchronize and runner is not None and runner.active \
                and not self._cs_synchronized:
            if closure is not None:
                raise ValueError(f"commsched: policy '{self._cs_config.policy.value}' defers the "
                                 "update to the next forward pass and cannot run a closure")
            runner.finish()
            self._cs_settle()
            self._cs_launch_rest()
            runner.begin()
            # Sparse rows are few and updated now, at step(), while dense blocks are deferred.
            self._cs_sparse.exchange()
            self._cs_sparse.step_now(self._cs_base_cls, self)
            self._cs_end_iteration()
            self._cs_engine.profiler.note("step_s", runner.take_update_seconds())
            self._cs_mark_step_end()
            return None
        if self._cs_should_synchronize:
            if self._cs_synchronized:
                warnings.warn(_STEP_AFTER_SYNCHRONIZE, stacklevel=2)
            self.synchronize()
        self._cs_synchronized = False
        started = _C.now_us()
        result = super().step(closure)
        self._cs_mark_step_end()
        self._cs_engine.span("update", started)
        self._cs_engine.profiler.note("step_s", (self._cs_step_end_us - started) / 1e6)
        return result

    def _cs_mark_step_end(self) -> None:
        self._cs_step_end_us = _C.now_us()
        self._cs_waited_at_step_end = self._cs_engine.waited_s

    def state_dict(self) -> dict[str, Any]:
        """torch's state plus a ``commsched`` entry (plan, iteration, pending profiling), which
        a plain torch optimizer ignores when it loads this."""
        self.flush()
        state = super().state_dict()
        state[checkpoint.KEY] = checkpoint.capture(self)
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Also restores the saved plan and position when ``state_dict`` has a ``commsched``
        entry (call it on every rank, or on one rank followed by broadcast_optimizer_state)."""
        self.flush()
        entry = state_dict.get(checkpoint.KEY)
        if entry is not None:
            checkpoint.validate(self, entry)  # before torch's state changes
        super().load_state_dict({k: v for k, v in state_dict.items() if k != checkpoint.KEY})
        if entry is not None and checkpoint.restore(self, entry):
            self._cs_check_restored = True

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._cs_pending:
            raise AssertionError(_ZERO_GRAD_PENDING)
        super().zero_grad(set_to_none=set_to_none)

    def set_backward_passes_per_step(self, passes: int) -> None:
        if passes <= 0:
            raise ValueError(f"backward_passes_per_step must be > 0, got {passes}")
        self.backward_passes_per_step = passes
        self._cs_delay = [passes] * len(self._cs_specs)
        self._cs_sparse.reset(passes)


def _dense_layout(param: torch.Tensor) -> torch.Tensor:
    """The gradient in row-major layout (channels-last or transposed parameters get strided
    gradients): the engine splits gradients into partitions of the flattened tensor and reduces
    them in place, which needs one contiguous buffer. The optimizer accepts either layout."""
    grad = param.grad
    assert grad is not None
    if not grad.is_contiguous():
        param.grad = grad = grad.contiguous()
    return grad


# Optimizers whose step needs every gradient at once: they cannot be split into per-block updates.
_UNSPLITTABLE = (torch.optim.LBFGS,)


def overlap_possible(model: Any, base_cls: type) -> bool:
    return isinstance(model, torch.nn.Module) and not issubclass(base_cls, _UNSPLITTABLE)


def check_overlap_allowed(policy: Policy, model: Any, base_cls: type) -> None:
    if model is None or not isinstance(model, torch.nn.Module):
        raise ValueError(f"commsched: policy '{policy.value}' applies each update in the next "
                         "forward pass and needs the model: DistributedOptimizer(..., model=model)")
    if issubclass(base_cls, _UNSPLITTABLE):
        raise ValueError(f"commsched: {base_cls.__name__} needs all gradients at once and cannot "
                         f"be split into per-block updates as policy '{policy.value}' does; use "
                         "policy='horovod', 'ddp' or 'mgwfbp' (synchronous)")


def DistributedOptimizer(  # noqa: N802 - Horovod's name
        optimizer: torch.optim.Optimizer,
        named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
        compression: Any = Compression.none,
        backward_passes_per_step: int = 1,
        op: Any = Average,
        gradient_predivide_factor: float = 1.0,
        num_groups: int = 0,
        groups: Any = None,
        sparse_as_dense: bool = False,
        model: torch.nn.Module | None = None,
        policy: str | None = None,
        **knobs: Any) -> torch.optim.Optimizer:
    """Wraps `optimizer` so that gradients are averaged across ranks by commsched's engine.

    Keyword arguments beyond Horovod's override any knob (see commsched.config.KNOBS).
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
    config = load_config({**knobs, "policy": policy})
    named = resolve_names(optimizer, named_parameters)
    group_of = resolve_groups([p for _, p in named if p.requires_grad], num_groups, groups)
    cls = type(optimizer.__class__.__name__, (_DistributedOptimizer, optimizer.__class__), {})
    wrapped: _DistributedOptimizer = object.__new__(cls)
    torch.optim.Optimizer.__init__(wrapped, optimizer.param_groups, optimizer.defaults)
    wrapped.state = optimizer.state
    adopt_plain_attributes(wrapped, optimizer)
    wrapped._cs_setup(named, resolve(compression), backward_passes_per_step, reduce_op,
                      float(gradient_predivide_factor), group_of, sparse_as_dense, model, config,
                      optimizer.__class__)
    return wrapped
