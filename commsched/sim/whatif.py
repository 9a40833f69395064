"""What-if sweeps: predicted iteration time per policy over workers x bandwidth x compression,
scaling factor, network utilisation, and the compression ratio a target scaling factor needs.

Scaling factor (weak scaling): T_1 / T_p, the throughput of p workers over p times the
throughput of one. T_1 is the iteration with no communication at all (one worker), T_p the
simulated iteration on p workers. 1.0 means communication is completely hidden.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from ..compression import LossyCompression
from ..config import Config, Policy
from .compressed import compress_run
from .network import Algorithm, FittedNetwork, LinkNetwork, Network
from .profile import RunProfile
from .rank import PlanCache, Ranked, allowed_policies, evaluate, mode_of
from .simulator import SimResult, simulate

TARGET_SCALING = 0.9
COMPRESSION_CAP = 1000.0
# Bisection on log(ratio) between 1 and the cap: 14 halvings bring the bracket within 0.05%.
BISECTION_STEPS = 14


@dataclass(frozen=True)
class LinkSpec:
    """The network of a what-if scenario, without the compression ratio."""

    workers: int
    bandwidth_bytes_per_s: float
    latency_s: float
    algorithm: Algorithm

    def network(self, compression: float = 1.0) -> LinkNetwork:
        return LinkNetwork(self.workers, self.bandwidth_bytes_per_s, self.latency_s,
                           self.algorithm, compression)


@dataclass
class Row:
    model: str
    policy: str
    knobs: dict[str, int]
    workers: int
    bandwidth_bytes_per_s: float | None  # None: the profile's fitted network
    compression: float | str  # a ratio, or a named compressor's label (e.g. powersgd(rank=4))
    iteration_s: float
    speedup_vs_horovod: float
    scaling: float
    utilisation: float | None  # wire bytes / (iteration x link bandwidth)
    busy_fraction: float  # channel busy time / iteration
    compression_for_target: float | None = None  # None: unreachable up to the cap
    searched: bool = False  # False: no search was made (fitted network)
    result: SimResult | None = field(default=None, repr=False)

    def as_json(self) -> dict:
        target: float | str | None = self.compression_for_target
        if self.searched and target is None:
            target = "unreachable"
        return {"model": self.model, "policy": self.policy, "knobs": self.knobs,
                "workers": self.workers,
                "bandwidth_gbit_s": None if self.bandwidth_bytes_per_s is None
                else self.bandwidth_bytes_per_s * 8 / 1e9,
                "compression": self.compression, "iteration_s": self.iteration_s,
                "speedup_vs_horovod": self.speedup_vs_horovod, "scaling": self.scaling,
                "utilisation": self.utilisation, "busy_fraction": self.busy_fraction,
                "compression_for_target": target}


def compute_only_s(run: RunProfile, cache: PlanCache) -> float:
    """T_1: one worker, where every collective costs nothing."""
    alone = LinkNetwork(1, 1.0, 0.0)
    plan = cache.plan(Policy.HOROVOD, {}, alone)
    return simulate(run, plan, alone, mode_of(Policy.HOROVOD)).iteration_s


def best_per_policy(cache: PlanCache, policies: list[Policy], net: Network,
                    tune: bool) -> dict[Policy, Ranked]:
    ranked = evaluate(cache, policies, net, tune)
    best: dict[Policy, Ranked] = {}
    for r in ranked:
        best.setdefault(r.policy, r)
    return best


def smallest_ratio(scaling_at: Callable[[float], float], target: float,
                   cap: float = COMPRESSION_CAP) -> float | None:
    """Smallest compression ratio in [1, cap] whose scaling factor reaches `target`, by
    bisection on log(ratio) (the answer is the bracket's upper end, so it always reaches the
    target); None when even `cap` does not (latency or compute alone prevent it)."""
    if scaling_at(1.0) >= target:
        return 1.0
    if scaling_at(cap) < target:
        return None
    low, high = 0.0, math.log(cap)
    for _ in range(BISECTION_STEPS):
        middle = (low + high) / 2
        if scaling_at(math.exp(middle)) >= target:
            high = middle
        else:
            low = middle
    return math.exp(high)


def utilisation(result: SimResult, net: Network) -> float | None:
    if isinstance(net, LinkNetwork):
        if net.workers <= 1 or result.iteration_s <= 0:
            return 0.0
        return result.wire_bytes / (result.iteration_s * net.bandwidth_bytes_per_s)
    return None


def _rows_for(model: str, cache: PlanCache, policies: list[Policy], net: Network,
              t1: float, tune: bool, workers: int,
              bandwidth: float | None, compression: float | str) -> dict[Policy, Row]:
    best = best_per_policy(cache, policies, net, tune)
    baseline = best[Policy.HOROVOD].predicted_s
    extra = [] if cache.compressed is None else list(cache.compressed.notes)
    rows = {}
    for policy in policies:
        r = best[policy]
        assert r.result is not None
        r.result.notes.extend(n for n in extra if n not in r.result.notes)
        rows[policy] = Row(model, policy.value, r.knobs, workers, bandwidth, compression,
                           r.predicted_s, baseline / r.predicted_s, t1 / r.predicted_s,
                           utilisation(r.result, net), r.result.network_busy_fraction,
                           result=r.result)
    return rows


Compression = float | LossyCompression  # one value of the compression axis


def sweep(model: str, run: RunProfile, base_cfg: Config, policies: list[Policy],
          links: list[LinkSpec], compressions: list[Compression], tune: bool = True,
          target: float = TARGET_SCALING) -> tuple[float, list[Row]]:
    """T_1 and one row per (link, compression, policy); `horovod` is always simulated, as the
    baseline of the speed-up, and reported only when asked for. A ratio divides every
    collective's bytes; a named compressor (PowerSGD, top-k) replaces the gradients it
    compresses by its wire tensors and adds its compute (sim/compressed.py); the overlap
    policies need a profile with module information, as they do uncompressed."""
    cache = PlanCache(run, base_cfg)
    t1 = compute_only_s(run, cache)
    simulated = policies if Policy.HOROVOD in policies else [Policy.HOROVOD, *policies]
    rows: list[Row] = []
    by_world: dict[tuple[int, str], PlanCache] = {}
    for link in links:
        needed = {policy: smallest_ratio(partial(_scaling_at, cache, policy, link, tune, t1),
                                         target) for policy in policies}
        for value in compressions:
            if isinstance(value, float | int):
                found = _rows_for(model, cache, simulated, link.network(value), t1, tune,
                                  link.workers, link.bandwidth_bytes_per_s, float(value))
                for policy in policies:
                    found[policy].compression_for_target = needed[policy]
                    found[policy].searched = True
                    rows.append(found[policy])
                continue
            key = (link.workers, value.label)
            if key not in by_world:
                by_world[key] = PlanCache(run, base_cfg, compress_run(run, value, link.workers))
            found = _rows_for(model, by_world[key], _simulable(run, simulated), link.network(),
                              t1, tune, link.workers, link.bandwidth_bytes_per_s, value.label)
            rows += [found[p] for p in policies if p in found]
    return t1, rows


def _scaling_at(cache: PlanCache, policy: Policy, link: LinkSpec, tune: bool, t1: float,
                ratio: float) -> float:
    best = best_per_policy(cache, [policy], link.network(ratio), tune)[policy]
    return t1 / best.predicted_s


def fitted_rows(model: str, run: RunProfile, doc: dict, base_cfg: Config,
                policies: list[Policy], tune: bool = True,
                compressors: tuple[LossyCompression, ...] = ()
                ) -> tuple[float, list[Row], list[str]]:
    """The profiled run's own network (fitted alpha/beta) at its own world size; uncompressed,
    then with each named compressor."""
    cache = PlanCache(run, base_cfg)
    t1 = compute_only_s(run, cache)
    net = FittedNetwork.from_document(doc)
    simulated = policies if Policy.HOROVOD in policies else [Policy.HOROVOD, *policies]
    found = _rows_for(model, cache, simulated, net, t1, tune, net.world_size, None, 1.0)
    rows = [found[p] for p in policies]
    for lossy in compressors:
        compressed = PlanCache(run, base_cfg, compress_run(run, lossy, net.world_size))
        found = _rows_for(model, compressed, _simulable(run, simulated), net, t1, tune,
                          net.world_size, None, lossy.label)
        rows += [found[p] for p in policies if p in found]
    return t1, rows, list(net.notes)


def _simulable(run: RunProfile, policies: list[Policy]) -> list[Policy]:
    """`policies` that the profile can simulate (rank.allowed_policies: the overlap ones need
    the forward pass's modules, which only a profile recorded with model= has)."""
    allowed = set(allowed_policies(run, overlap_allowed=True))
    return [p for p in policies if p in allowed]


def describe_knobs(knobs: dict[str, int]) -> str:
    parts = []
    for key, value in sorted(knobs.items()):
        shown = f"{value // (1 << 20)}MiB" if value % (1 << 20) == 0 and value else str(value)
        parts.append(f"{key}={shown}")
    return ",".join(parts) or "-"
