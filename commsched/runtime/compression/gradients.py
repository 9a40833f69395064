"""Lossy gradient compression at run time: PowerSGD and top-k with error feedback, their wire
tensors handed to the engine as blocks of the plan (Note [Compressed tensors are blocks of the
plan], commsched/plan/compressed.py).

What happens to one compressed gradient (read top to bottom):
    backward:      the hook hands the gradient here instead of to the engine: M = g + e (the
                   residual e holds M from now on; top-k under momentum SGD: e is DGC's
                   accumulated velocity v instead, Note [DGC under the user's momentum] in
                   runtime/compression/dgc_momentum.py); PowerSGD: P = M Q, P marked ready (its
                   block is
                   reduced with the gradients); top-k: its k largest entries go to this rank's
                   slice of the values/indices wire tensors, e (and DGC's velocity) loses them,
                   and the last compressed gradient marks those tensors ready
    synchronize(): `release_late`: PowerSGD: per Q in plan order, wait for P's block,
                   orthogonalise P, Q = M^T P, mark Q ready; the engine reduces the Qs
                   `finish`: p.grad = P Q^T (PowerSGD; e = M - P Q^T, Q kept as the next
                   warm start) or the sum of every rank's entries (top-k), both scaled as the
                   engine scales an all-reduce (Average, gradient_predivide_factor); under DGC,
                   the gradient from which the user's SGD makes exactly that update

Note [Residuals are per rank, Q is shared]
The residual of error feedback is this rank's own (what its compressed message left out); Q
after its all-reduce is the same on every rank. Both are in the wrapped optimizer's
state_dict(): saved and loaded per rank, a resumed run continues bit for bit. Copied from
rank 0 by broadcast_optimizer_state, every rank gets rank 0's residuals: training goes on
correctly (identical parameters everywhere), only not bit-identically to the run saved.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from ...compression import LossyCompression, PowerSGD, TopK
from ...compression_math import (
    initial_q,
    matrix_shape,
    orthogonalise_,
    topk_combine,
    topk_select,
    warm_start_,
)
from ...plan import Plan, TensorSpec
from ...plan.compressed import (
    Factored,
    WireLayout,
    powersgd_wire,
)
from ...sim import RunProfile
from ...sim.compressed import CompressedRun, attach_wire
from ..engine.handle import EngineHandle
from .dgc_momentum import MomentumCorrection, correction_for
from .topk_wire import TopkStages, check_wire_tensor, topk_stages


class _Plans(Protocol):
    """What the compressor needs of the plan lifecycle (lifecycle.py imports this module)."""

    compressor: CompressedGradients | None

    def reinstall(self, iteration: int) -> None: ...

    def finish_updates(self) -> None: ...

STATE_VERSION = 1

# Note [Compression under an overlap plan]
# Every policy compresses. Synchronous plans rebuild every gradient in synchronize(). Under an
# overlap plan (bytescheduler, prophet, dear, or `auto` choosing one) step() releases the second
# round as the synchronous path does (PowerSGD: waits for the P blocks, DeAR's all-gathers of
# them released first; computes and hands over the Qs; top-k has no second round) and returns;
# each update group rebuilds its compressed gradients (`decompress`) in the next forward pass,
# right after waiting for the last block of their wire tensors (WireLayout.carriers), and
# before the one optimizer call that applies them. Nothing else touches the residuals and Q in
# between: the next backward's first gradient makes the runner apply whatever is still pending
# before any gradient is handed over.


def eligible(spec: TensorSpec, param: torch.Tensor, lossy: LossyCompression) -> bool:
    """Horovod `groups` members stay uncompressed: a group is reduced in one block, which a
    tensor split into factors cannot be part of."""
    return spec.group is None and param.dtype.is_floating_point and lossy.compresses(param.shape)


class CompressedGradients:
    """The compressed gradients of one wrapped optimizer, their state and wire tensors."""

    def __init__(self, lossy: LossyCompression, specs: Sequence[TensorSpec],
                 params: Sequence[torch.Tensor], world_size: int, rank: int) -> None:
        self.lossy = lossy
        self.ids = [s.tensor_id for s, p in zip(specs, params, strict=True)
                    if eligible(s, p, lossy)]
        self.params = [params[t] for t in self.ids]
        self.names = [specs[t].name for t in self.ids]
        self._specs = list(specs)
        self.on = False  # compressing this iteration (iteration >= start_step)
        self._world, self._rank = world_size, rank
        self._next_id = len(specs)
        self._wire: list[TensorSpec] = []
        self.residuals = [torch.zeros(_shape2(p), dtype=p.dtype, device=p.device)
                          for p in self.params]
        self._handed: list[bool] = [False] * len(self.ids)
        self._pending = 0
        self.topk: TopkStages | None = None  # top-k's wire tensors, per stage of its warm-up
        self._fixed_layout = self._powersgd_layout() if isinstance(lossy, PowerSGD) \
            else self._topk_layout()
        self.correction: MomentumCorrection | None = None  # attach() decides
        self._positions: tuple[int, list[int], list[int]] | None = None  # per installed plan
        # Training-thread seconds this iteration spent on the second round and decompressing,
        # outside the gradient hooks (waits for the engine excluded): compute.compression_s.
        self.busy_s = 0.0

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def layout(self) -> WireLayout:
        """The wire in force: PowerSGD's, or the top-k warm-up stage's."""
        return self._fixed_layout if self.topk is None else self.topk.layout

    @property
    def wire_specs(self) -> list[TensorSpec]:
        return list(self._wire)

    def _adopt(self, specs: Sequence[TensorSpec], tensors: Sequence[torch.Tensor]) -> None:
        """Takes the layout's wire specs (commsched.plan.compressed builds them, for the
        simulator too); each must describe the tensor the run allocated for it."""
        for spec, tensor in zip(specs, tensors, strict=True):
            check_wire_tensor(spec, tensor)
        self._wire.extend(specs)
        self._next_id += len(specs)

    # -- layouts -----------------------------------------------------------------------------

    def _powersgd_layout(self) -> WireLayout:
        """Note [Q is kept transposed]
        Q (m x r) and its wire tensor are stored as r x m rows: ``self.q`` holds transposed
        views (m x r, column-major) and ``self.q_wire`` the r x m tensors the engine reduces.
        P = M Q then reads Q column-major and Q^T = P^T M writes rows, the layouts a BLAS
        library's kernels for a thin factor prefer: on one CPU core (MKL) the two products
        cost several times less per iteration, for the built-in Transformer's 18 compressed
        matrices and for the CNN's, than with Q row-major (M^T P into m x r, as DDP's PowerSGD
        hook does), as scripts/powersgd_cost.py measures (figures: benchmarks/notes/README.md,
        'Q is kept transposed'). The same products (to rounding), the same wire size; the
        checkpoint keeps Q as an m x r matrix."""
        assert isinstance(self.lossy, PowerSGD)
        lossy = self.lossy
        self.q = [initial_q(matrix_shape(p.shape)[1], lossy.rank_for(p.shape), seed=i,
                            dtype=p.dtype, device=p.device).T.contiguous().T
                  for i, p in enumerate(self.params)]
        self.p_wire = [torch.empty(matrix_shape(p.shape)[0], lossy.rank_for(p.shape),
                                   dtype=p.dtype, device=p.device) for p in self.params]
        self.q_wire = [torch.empty(q.shape[1], q.shape[0], dtype=q.dtype, device=q.device)
                       for q in self.q]
        factored = [Factored(self._specs[t], *matrix_shape(p.shape), lossy.rank_for(p.shape))
                    for t, p in zip(self.ids, self.params, strict=True)]
        layout = powersgd_wire(lossy.label, factored, self._next_id)
        self._adopt(layout.early + layout.late, self.p_wire + self.q_wire)
        self.p_ids = [s.tensor_id for s in layout.early]
        self.q_ids = [s.tensor_id for s in layout.late]
        return layout

    def _topk_layout(self) -> WireLayout:
        """One values and one indices tensor per dtype, world x (sum of k) long: rank r's
        entries are its r-th slice (the engine's standalone all-gather); one set per stage of
        the warm-up (Note [Each warm-up stage has its own wire tensors], topk_wire.py)."""
        assert isinstance(self.lossy, TopK)
        wires = topk_stages(self.lossy.label, self.lossy.stages(),
                            [self._specs[t] for t in self.ids], self.params, self.lossy.k,
                            self._world, self._next_id)
        for wire in wires:
            self._wire.extend(wire.layout.gathered)
            self._next_id += len(wire.layout.gathered)
        device = self.params[0].device if self.params else torch.device("cpu")
        self.topk = TopkStages(wires, self._world, device)
        return wires[0].layout

    def attach(self, optimizer: torch.optim.Optimizer, base_cls: type[torch.optim.Optimizer],
               average: bool) -> None:
        """Top-k under momentum SGD: DGC's momentum correction (Note [DGC under the user's
        momentum], runtime/compression/dgc_momentum.py); warns where a momentum cannot be corrected.

        Args:
            optimizer: the wrapped optimizer (held weakly), whose groups and state are read.
            base_cls: the user's optimizer class (whose step the wrapper runs).
            average: whether the op averages (else Sum: weight decay is shared out).
        """
        self.correction = correction_for(self.lossy, optimizer, base_cls, self.params,
                                         [tuple(e.shape) for e in self.residuals],
                                         self._world, average)

    # -- backward ----------------------------------------------------------------------------

    def begin(self, engine: EngineHandle) -> None:
        self._engine = engine

    # -- when compression starts --------------------------------------------------------------

    def switch_on_at(self, iteration: int, lifecycle: _Plans) -> None:
        """Compression starts at its start_step: from then on the plans carry its wire tensors
        (commsched.plan.compressed); the plan in place is rebuilt when it starts mid-run. (The
        C++ gradient intake leaves a compressed tensor's gradient to Python, whose slow path
        hands it over here: runtime/intake/gradient_intake.py.)"""
        if self.on:
            if self.topk is not None and self.topk.due(iteration):
                # Top-k's next warm-up stage: the updates still deferred are rebuilt from the
                # stage that sent them, whose tensors the switch releases.
                lifecycle.finish_updates()
                if self.topk.follow(iteration):
                    lifecycle.reinstall(iteration)
            return
        if iteration < self.lossy.start_step:
            return
        self.on = True
        lifecycle.compressor = self
        if iteration > 0:
            lifecycle.reinstall(iteration)
            if self.correction is not None:
                self.correction.continue_from_buffers()

    def restored_at(self, iteration: int, lifecycle: _Plans) -> None:
        """After load_state_dict(): compressing or not as the saved run was at this iteration
        (the restored plan already carries the wire tensors if it was)."""
        if self.topk is not None:  # top-k: the warm-up stage of this iteration
            self.topk.follow(iteration)
        if iteration >= self.lossy.start_step:
            self.on = True
            lifecycle.compressor = self
            if iteration == self.lossy.start_step > 0 and self.correction is not None:
                self.correction.continue_from_buffers()  # saved before its first hand-over

    def hand_over(self, index: int, grad: torch.Tensor) -> None:
        """The gradient of compressed tensor `index` (position in `ids`), on its last pass.
        Not counted in busy_s: its time lengthens backward, which the ready times show."""
        # The gradient is in no block, but the engine keeps its ready time for the profile:
        # top-k marks its wire tensors only with the last gradient, and the simulator needs
        # the backward pass's real length (Note [Simulated compression compute]).
        self._engine.mark_ready(self.ids[index], grad)
        residual = self.residuals[index]
        self._handed[index] = True
        correction = self.correction
        if correction is None or not correction.accumulate(index, grad.view(residual.shape),
                                                           residual):
            residual += grad.view(residual.shape)  # residual now holds M = g + e
        if isinstance(self.lossy, PowerSGD):
            torch.matmul(residual, self.q[index], out=self.p_wire[index])
            self._engine.mark_ready(self.p_ids[index], self.p_wire[index])
            return
        self._select(index, residual)
        self._pending += 1
        if self._pending == len(self.ids):
            assert self.topk is not None
            for tensor_id, tensor in self.topk.current.gathered_ids:
                self._engine.mark_ready(tensor_id, tensor)

    def _select(self, index: int, m: torch.Tensor) -> None:
        assert self.topk is not None
        wire = self.topk.current
        values, indices = topk_select(m, wire.k[index])
        wire.put(index, self.params[index].dtype, self._rank, values, indices)
        m.view(-1)[indices.long()] = 0  # what was sent leaves the residual
        if self.correction is not None:
            self.correction.mask(index, m, indices)  # and the velocity, under DGC

    def launch_rest(self) -> None:
        """Gradients not produced on this rank count as zeros (Horovod's rule)."""
        for index, handed in enumerate(self._handed):
            if handed:
                continue
            param = self.params[index]
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            elif param.grad.is_sparse:
                param.grad = param.grad.to_dense()
            self.hand_over(index, param.grad.contiguous())

    # -- synchronize ------------------------------------------------------------------------

    def _plan_positions(self, plan: Plan) -> tuple[list[int], list[int]]:
        """(position of each P's block, the Q indices in the order of their blocks)."""
        position = {p.tensor_id: i for i, b in enumerate(plan.blocks) for p in b.pieces}
        p_pos = [position[t] for t in self.p_ids]
        q_order = sorted(range(len(self.ids)), key=lambda i: (position[self.q_ids[i]], i))
        return p_pos, q_order

    def release_late(self, plan: Plan,
                     before_wait: Callable[[int], None] | None = None) -> None:
        """PowerSGD's second round: each Q, in plan order, once its P was reduced.
        `before_wait(position)`: what must happen before the wait for the block at `position`
        (an overlap runner releases DeAR's all-gathers up to it)."""
        if not isinstance(self.lossy, PowerSGD) or not self.ids:
            return
        if self._positions is None or self._positions[0] != id(plan):
            self._positions = (id(plan), *self._plan_positions(plan))
        _, p_pos, q_order = self._positions
        started, waited_before = time.perf_counter(), self._engine.waited_s
        waited = -1
        for index in q_order:
            if p_pos[index] > waited:
                waited = p_pos[index]
                if before_wait is not None:
                    before_wait(waited)
                self._engine.wait_block(waited)
            p_hat = orthogonalise_(self.p_wire[index])
            # Q^T = P^T M (Note [Q is kept transposed])
            torch.matmul(p_hat.T, self.residuals[index], out=self.q_wire[index])
            self._engine.mark_ready(self.q_ids[index], self.q_wire[index])
        self.busy_s += time.perf_counter() - started - (self._engine.waited_s - waited_before)

    def finish(self, scale: float) -> None:
        """After every block completed: the gradients from the exchanged messages; `scale` is
        the product of the engine's pre- and post-scale (top-k sums them itself)."""
        for index, param in enumerate(self.params):
            assert param.grad is not None
            self.decompress(index, param.grad, scale)
        self.end_round()

    def end_round(self) -> None:
        """Every compressed gradient of the iteration was handed over and its second round
        released: the next backward starts a new round (decompress may still follow)."""
        self._handed = [False] * len(self.ids)
        self._pending = 0

    def decompress(self, index: int, out: torch.Tensor, scale: float) -> None:
        """Compressed tensor `index`'s gradient, rebuilt from the exchanged messages (its
        blocks done) into `out`; PowerSGD also keeps the residual and the next warm start.
        An overlap plan calls it per update group, in the next forward pass."""
        started = time.perf_counter()
        if isinstance(self.lossy, PowerSGD):
            # P Q^T straight into the gradient (no temporary of the gradient's size).
            approx = out.view(self.residuals[index].shape)
            torch.matmul(self.p_wire[index], self.q_wire[index], out=approx)
            self.residuals[index] -= approx
            warm_start_(self.q[index], self.q_wire[index].T)
        else:
            out.view(-1).copy_(self._combined(index, scale))
            if self.correction is not None:  # Note [DGC under the user's momentum]
                self.correction.to_gradient(index, out)
        _finite_(self.residuals[index])
        self.busy_s += time.perf_counter() - started

    def simulated(self, run: RunProfile) -> CompressedRun:
        """`run` (this optimizer's profile) as the simulator sees it under this compressor:
        with the wire tensors it sends, laid out exactly as here."""
        shapes = [_shape2(p) for p in self.params]
        return attach_wire(run, self.layout, self.lossy, shapes, registered=self._wire)

    def take_busy_s(self) -> float:
        busy, self.busy_s = self.busy_s, 0.0
        return busy

    def _combined(self, index: int, scale: float) -> torch.Tensor:
        assert self.topk is not None
        p = self.params[index]
        values, indices = self.topk.current.entries(index, p.dtype, self._world)
        return topk_combine(p.numel(), values, indices, scale, p.dtype)

    # -- state ---------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "label": self.lossy.label, "names": list(self.names),
                "residuals": [e.clone() for e in self.residuals],
                "q": [q.clone(memory_format=torch.contiguous_format)
                      for q in getattr(self, "q", [])],
                "velocities": [] if self.correction is None
                else [u.clone() for u in self.correction.velocities]}

    def check_state(self, saved: dict[str, Any]) -> None:
        if saved.get("version") != STATE_VERSION or saved.get("label") != self.lossy.label \
                or list(saved.get("names", [])) != self.names:
            raise ValueError(f"commsched: the checkpoint's compression state "
                             f"({saved.get('label')!r} over {len(saved.get('names', []))} "
                             f"tensors) does not fit this optimizer's ({self.lossy.label!r} "
                             f"over {len(self.names)} tensors)")

    def load(self, saved: dict[str, Any]) -> None:
        self.check_state(saved)
        for mine, theirs in zip(self.residuals, saved["residuals"], strict=True):
            mine.copy_(theirs)
        for mine, theirs in zip(getattr(self, "q", []), saved["q"], strict=True):
            mine.copy_(theirs)
        if self.correction is not None and saved.get("velocities"):
            self.correction.load(saved["velocities"])


def _finite_(residual: torch.Tensor) -> None:
    """An overflowing step (AMP's loss scaler skips it) leaves inf or NaN in M: the gradient
    keeps them, so that the scaler sees the overflow, but the residual drops them, or every
    later step would inherit them. In place, with no synchronisation with the device."""
    residual.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)


def _shape2(p: torch.Tensor) -> tuple[int, ...]:
    return matrix_shape(p.shape) if p.dim() >= 2 else tuple(p.shape)


