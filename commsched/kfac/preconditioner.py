"""commsched.kfac.KFACPreconditioner: distributed K-FAC whose factor traffic runs on the engine.

Use with commsched.DistributedOptimizer (docs/kfac.md):

    loss.backward()
    optimizer.synchronize()          # gradients averaged across ranks
    preconditioner.step()            # gradients of Linear/Conv2d layers preconditioned in place
    with optimizer.skip_synchronize():
        optimizer.step()
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..config import load_config
from ..world.errors import elastic
from . import factors as fx
from .binding import FactorWorld, bind, make_layout
from .capture import FactorCapture
from .elastic import register_state_handler
from .placement import LOCAL, Assignment, Placement

Schedule = float | Callable[[int], float]


@dataclass
class _Layer:
    name: str
    module: nn.Module
    a: torch.Tensor | None = None  # running averages
    g: torch.Tensor | None = None
    # eigen: qa, da, qg, dg; inverse: a_inv, g_inv
    decomposition: dict[str, torch.Tensor] = field(default_factory=dict)


def _check_choice(enum_type: Any, value: Any, what: str) -> Any:
    try:
        return enum_type(value)
    except ValueError:
        known = ", ".join(repr(m.value) for m in enum_type)
        raise ValueError(f"commsched.kfac: {what}={value!r} is not one of {known}") from None


def _check_interval(value: Any, what: str) -> None:
    if callable(value):
        return  # checked when called
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"commsched.kfac: {what} must be an integer >= 1 or a callable of the "
                         f"step, got {value!r}")


def _check_schedule(value: Any, what: str, low: float, high: float = math.inf,
                    closed_high: bool = False) -> None:
    if callable(value):
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            low <= value < high or (closed_high and value == high)):
        raise ValueError(f"commsched.kfac: {what} must be a number in [{low}, {high}"
                         f"{']' if closed_high else ')'} or a callable of the step, got {value!r}")


def _check_arguments(factor_update_steps: Any, inv_update_steps: Any, damping: Any,
                     factor_decay: Any, kl_clip: Any, lr: Any, local_threshold: Any) -> None:
    _check_interval(factor_update_steps, "factor_update_steps")
    _check_interval(inv_update_steps, "inv_update_steps")
    _check_schedule(damping, "damping", 0.0)
    _check_schedule(factor_decay, "factor_decay", 0.0, 1.0)
    _check_schedule(lr, "lr", 0.0)
    if kl_clip is not None:
        _check_schedule(kl_clip, "kl_clip", 0.0)
    if isinstance(local_threshold, bool) or not isinstance(local_threshold, int) \
            or local_threshold < 0:
        raise ValueError(f"commsched.kfac: local_threshold must be an integer >= 0, "
                         f"got {local_threshold!r}")


def _check_checkpoint(state: dict[str, Any], method: fx.ComputeMethod,
                      layer_names: list[str]) -> None:
    if state.get("compute_method") != method.value:
        raise ValueError(f"commsched.kfac: checkpoint holds compute_method="
                         f"{state.get('compute_method')!r}, this preconditioner uses "
                         f"{method.value!r}")
    saved = state["layers"]
    if any(name not in saved for name in layer_names) or len(saved) != len(layer_names):
        raise ValueError(f"commsched.kfac: checkpoint layers {sorted(saved)} do not match the "
                         f"preconditioned layers {layer_names}")


class KFACPreconditioner:
    """Distributed K-FAC (SPD-KFAC): replaces the gradients of `model`'s Linear and Conv2d layers.

    Each preconditioned layer's gradient M becomes its K-FAC direction, (G ⊗ A + damping I)^-1
    applied to M, KL-clipped; other layers keep their plain gradient for the optimizer. The
    Kronecker factors A and G are computed by forward and output-gradient hooks and averaged
    across ranks on an engine of their own as soon as they exist (fused by the ``mgwfbp`` rule);
    the decompositions are spread over the ranks by load and shared by one all-gather. Use it
    between ``optimizer.synchronize()`` and ``optimizer.step()`` inside
    ``optimizer.skip_synchronize()`` (the module's example; docs/kfac.md has the formulas).

    Attributes:
        steps: step() calls so far; the argument of every schedule (callable hyper-parameter).
        last_scale: the KL-clip factor the last step() applied (1.0: no clipping).
        assignment: which rank computes which factor's decomposition (logged at INFO).
        bound: the exchanges and placement for the world of now (kfac/binding.py), or None
            before an elastic job's first use.
    """

    def __init__(self, model: nn.Module, *, factor_update_steps: int | Callable[[int], int] = 1,
                 inv_update_steps: int | Callable[[int], int] = 10, damping: Schedule = 1e-3,
                 factor_decay: Schedule = 0.95, kl_clip: Schedule | None = 1e-3,
                 lr: Schedule = 0.1, compute_method: str = "eigen", placement: str = "lpt",
                 local_threshold: int = 128, skip_layers: Iterable[str] = (),
                 symmetric: bool = True, pipelined: bool = True,
                 profile_steps: int | None = None, grad_scaler: Any = None) -> None:
        """Hooks `model`'s layers and joins the world; every rank constructs it alike.

        In an elastic Horovod job it joins at its first use instead, and again in each world
        the job re-forms; pass it to ``hvd.elastic.TorchState`` (docs/kfac.md).

        `damping`, `factor_decay`, `kl_clip`, `lr`, `factor_update_steps` and `inv_update_steps`
        may be callables of the step number (``steps``, from 0), checked when called.

        Args:
            model: the model whose nn.Linear and nn.Conv2d layers (weights that require grad)
                are preconditioned; the factors live on the device of the first one's weight.
            factor_update_steps: compute and average the factors every this many steps.
            inv_update_steps: recompute the decompositions every this many steps.
            damping: Tikhonov damping added to the factors' Kronecker product, >= 0.
            factor_decay: running-average weight of the old factors, in [0, 1).
            kl_clip: bound of the KL clip on the update's size, >= 0; None or 0: no clipping.
            lr: the optimizer's learning rate, which the KL clip scales by, >= 0.
            compute_method: ``"eigen"`` (eigendecompositions) or ``"inverse"`` (damped
                inverses, the damping split evenly over the two factors).
            placement: how decompositions are placed on ranks: ``"lpt"`` (longest processing
                time first) or ``"round_robin"``.
            local_threshold: factors of at most this dimension are decomposed on every rank,
                with no traffic.
            skip_layers: module names or class names (case-insensitive, exact) to leave alone.
            symmetric: send only the upper triangles of the symmetric factors (about half the
                bytes).
            pipelined: hand each factor to the engine as soon as it is computed; False keeps
                them until step(), for comparison.
            profile_steps: factor updates sent one block per factor before the fused plan is
                built; None: COMMSCHED_PROFILE_STEPS.
            grad_scaler: a ``torch.amp.GradScaler``, or a callable returning the loss scale,
                so that G is that of the unscaled loss; None without loss scaling.

        Raises:
            ValueError: a hyper-parameter out of range or of the wrong type, an unknown
                compute_method or placement, or no layer to precondition (after skip_layers).
            ConfigError: a ``COMMSCHED_*`` knob it reads has a value that is not allowed.
        """
        _check_arguments(factor_update_steps, inv_update_steps, damping, factor_decay, kl_clip,
                         lr, local_threshold)
        self.method = _check_choice(fx.ComputeMethod, compute_method, "compute_method")
        self.placement = _check_choice(Placement, placement, "placement")
        self.factor_update_steps, self.inv_update_steps = factor_update_steps, inv_update_steps
        self.damping, self.factor_decay, self.kl_clip, self.lr = damping, factor_decay, kl_clip, lr
        self.symmetric = symmetric
        self.steps = 0
        self.last_scale = 1.0
        skip = {s.lower() for s in skip_layers}
        self.layers = [_Layer(name, m) for name, m in model.named_modules()
                       if fx.supported(m) and name.lower() not in skip
                       and type(m).__name__.lower() not in skip and fx.weight_of(m).requires_grad]
        if not self.layers:
            raise ValueError("commsched.kfac: the model has no nn.Linear or nn.Conv2d layer to "
                             "precondition (after skip_layers)")
        # Factors and decompositions in at least single precision (half-precision factors lose
        # the small eigenvalues that damping is compared with), on the model's device.
        weights = [fx.weight_of(lay.module) for lay in self.layers]
        dtype = torch.float64 if any(w.dtype == torch.float64 for w in weights) else torch.float32
        self.factor_dtype = dtype
        first_weight = weights[0]

        def like() -> torch.Tensor:  # read at use time: the model may move after construction
            return first_weight.new_zeros(0, dtype=dtype)
        self._like, self._cfg = like, load_config()
        self._profile_steps = self._cfg.profile_steps if profile_steps is None else profile_steps
        self._local_threshold = local_threshold
        self.dims = {f"{lay.name}.{kind}": dim for lay in self.layers
                     for kind, dim in (("A", fx.a_dim(lay.module)), ("G", fx.g_dim(lay.module)))}
        self.layout = make_layout(self.dims, symmetric, self.method)
        self.capture = FactorCapture([(lay.name, lay.module) for lay in self.layers], self._parts,
                                     self._updating_factors, dtype, pipelined, grad_scaler)
        # The parts for the world of now (kfac/binding.py): made here, or in an elastic Horovod
        # job at the first use and again in every re-formed world (Note [Elastic K-FAC]).
        self.bound: FactorWorld | None = None
        self.elastic = elastic()
        if self.elastic:
            register_state_handler(KFACPreconditioner)
        else:
            self._parts()

    # -- the world -------------------------------------------------------------------------------

    def _parts(self) -> FactorWorld:
        """The exchanges for the world of now.

        (Re)binds where there are none or an elastic job's world changed (collective: every
        rank reaches it at the same point).
        """
        if self.bound is None or (self.elastic and self.bound.stale):
            self._unbind()
            self.bound = bind(self.layout, self._like, self._cfg, self._profile_steps,
                              self.placement, self._local_threshold, self.steps)
        return self.bound

    def _unbind(self) -> None:
        """Drops the exchanges, and what the passes since the last step() computed.

        Their engines stop without waiting: an elastic job's world may have lost a peer.
        """
        if self.bound is not None:
            self.bound.shutdown()
            self.bound = None
        self.capture.forget()

    @property
    def assignment(self) -> Assignment:
        """Which rank computes which factor's decomposition (logged at INFO)."""
        return self._parts().assignment

    # -- schedules -------------------------------------------------------------------------------

    def _at(self, value: Any) -> Any:
        return value(self.steps) if callable(value) else value

    def _interval(self, value: Any, what: str) -> int:
        interval = self._at(value)
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise ValueError(f"commsched.kfac: {what} gave {interval!r} at step {self.steps}; "
                             "it must be an integer >= 1")
        return interval

    def _updating_factors(self) -> bool:
        return self.steps % self._interval(self.factor_update_steps, "factor_update_steps") == 0

    # -- step ---------------------------------------------------------------------------------

    def step(self) -> None:
        """Replaces the preconditioned layers' gradients by their K-FAC directions.

        On a factor-update step it first waits for this step's factors, averaged across ranks,
        and folds them into the running averages; when decompositions are due it recomputes
        those this rank owns and shares them; then it writes the KL-clipped directions into
        ``.grad``. Call it on every rank after ``optimizer.synchronize()`` (collective on
        factor-update steps), and with a GradScaler after ``scaler.unscale_(optimizer)`` so that
        the KL clip sees true gradients.

        Raises:
            RuntimeError: the first decomposition found no factors: no forward and backward
                pass of the model ran in training mode before it.
            ValueError: a callable interval returned something other than an integer >= 1.
            RankFailureError: a collective failed or timed out.
            MismatchError: the ranks' factor plans differ.
        """
        if self._updating_factors():
            self._update_factors()  # collective: on every rank, whatever ran here
        if self.steps % self._interval(self.inv_update_steps, "inv_update_steps") == 0:
            self._update_decompositions()
        self._precondition()
        self.steps += 1

    def _update_factors(self) -> None:
        self.capture.hand_over()
        averaged = self._parts().factors.finish()
        decay = float(self._at(self.factor_decay))
        for layer in self.layers:
            for kind in ("a", "g"):
                name = f"{layer.name}.{kind.upper()}"
                flat = averaged[name]
                if flat is None:  # no rank ran the layer: its running average stands
                    continue
                new = self._unflatten(flat, self.dims[name])
                old = getattr(layer, kind)
                setattr(layer, kind, new if old is None else decay * old + (1 - decay) * new)

    def _unflatten(self, flat: torch.Tensor, dim: int) -> torch.Tensor:
        packed = self._parts().pack
        return fx.unpack_upper(flat, dim) if packed else flat.reshape(dim, dim).clone()

    def _decompose(self, name: str, factor: torch.Tensor, damping: float) -> torch.Tensor:
        if self.method is fx.ComputeMethod.EIGEN:
            vectors, values = fx.eigen(factor)
            return torch.cat([vectors.reshape(-1), values])
        inverse = fx.damped_inverse(factor, damping)
        return fx.pack_upper(inverse) if self._parts().pack else inverse.reshape(-1)

    def _update_decompositions(self) -> None:
        damping = float(self._at(self.damping))
        # Layers without both factors yet (none of their passes ran) keep their plain gradient;
        # which layers those are is the same on every rank (factor averages are collective).
        ready = [lay for lay in self.layers if lay.a is not None and lay.g is not None]
        if not ready:
            raise RuntimeError("commsched.kfac: no factors yet: the first step must run a "
                               "forward and backward pass of the model in training mode")
        factor_of: dict[str, torch.Tensor] = {}
        for layer in ready:
            assert layer.a is not None and layer.g is not None
            factor_of[f"{layer.name}.A"], factor_of[f"{layer.name}.G"] = layer.a, layer.g
        parts = self._parts()
        owner, rank = parts.assignment.owner, parts.world.rank
        mine = {n: self._decompose(n, factor_of[n], damping) for n in factor_of if owner[n] == rank}
        shared = parts.results.share(mine)
        for name in factor_of:
            if owner[name] == LOCAL:
                shared[name] = self._decompose(name, factor_of[name], damping)
        for layer in ready:
            for kind in ("a", "g"):
                name = f"{layer.name}.{kind.upper()}"
                self._store(layer, kind, shared[name], self.dims[name])

    def _store(self, layer: _Layer, kind: str, flat: torch.Tensor, dim: int) -> None:
        if self.method is fx.ComputeMethod.EIGEN:
            layer.decomposition[f"q{kind}"] = flat[: dim * dim].reshape(dim, dim).clone()
            layer.decomposition[f"d{kind}"] = flat[dim * dim:].clone()
        else:
            layer.decomposition[f"{kind}_inv"] = self._unflatten(flat, dim)

    def _precondition(self) -> None:
        damping = float(self._at(self.damping))
        directions: list[tuple[_Layer, torch.Tensor]] = []
        vg_sum = 0.0
        for layer in self.layers:
            grad = fx.gradient_matrix(layer.module)
            if grad is None or not layer.decomposition:
                continue
            grad = grad.to(self.factor_dtype)
            d = layer.decomposition
            if self.method is fx.ComputeMethod.EIGEN:
                direction = fx.precondition_eigen(grad, d["qa"], d["da"], d["qg"], d["dg"],
                                                  damping)
            else:
                direction = fx.precondition_inverse(grad, d["a_inv"], d["g_inv"])
            vg_sum += float((direction * grad).sum()) * float(self._at(self.lr)) ** 2
            directions.append((layer, direction))
        scale = 1.0
        kl_clip = self._at(self.kl_clip) if self.kl_clip is not None else None
        if kl_clip and vg_sum != 0.0:
            scale = min(1.0, math.sqrt(kl_clip / abs(vg_sum)))
        for layer, direction in directions:
            fx.write_gradient(layer.module, direction * scale)
        self.last_scale = scale

    # -- checkpoints and shutdown ------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The preconditioner's state for a checkpoint, beside the optimizer's.

        Returns:
            The step count, each layer's running factors and decompositions, the compute method
            and the factor exchange's plan and position.
        """
        layers = {lay.name: {"a": lay.a, "g": lay.g, **lay.decomposition} for lay in self.layers}
        return {"steps": self.steps, "layers": layers, "compute_method": self.method.value,
                "symmetric": self.symmetric,
                "factor_exchange": None if self.bound is None else self.bound.factors.state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores what state_dict() saved, on this rank, moving tensors to the factors' device.

        Args:
            state: what state_dict() of a preconditioner of the same layers returned.

        Raises:
            ValueError: `state` was saved with another compute_method, or for other layers.
        """
        _check_checkpoint(state, self.method, [lay.name for lay in self.layers])
        if self.elastic:  # Note [Elastic K-FAC]: the next use binds to the world of now
            self._unbind()
        saved = state["layers"]
        for layer in self.layers:
            device = fx.weight_of(layer.module).device
            entry = {k: None if v is None
                     else v.to(device=device, dtype=self.factor_dtype, copy=True)
                     for k, v in saved[layer.name].items()}
            layer.a, layer.g = entry.pop("a"), entry.pop("g")
            layer.decomposition = {k: v for k, v in entry.items() if v is not None}
        self.steps = int(state["steps"])
        if state.get("factor_exchange") is not None and self.bound is not None:
            self.bound.factors.restore(state["factor_exchange"])

    def shutdown(self) -> None:
        """Removes the layer hooks and stops the preconditioner's engines and their threads."""
        self.capture.remove()
        self._unbind()
