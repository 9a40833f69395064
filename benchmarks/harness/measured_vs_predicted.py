"""Checks the simulator against measurement: each commsched candidate's own profile at the end
of its run (the world's: the collectives of the rank the others waited for and every rank's
compute, runtime/planning/world_profile.py) and its installed plan are simulated, and the
prediction is
set beside the measured median."""

from __future__ import annotations

from typing import Any

from commsched.bench.candidate import is_control, parse_candidate
from commsched.bench.compressed_candidates import COMPRESSION_KNOBS
from commsched.compression import LossyCompression
from commsched.config import Policy
from commsched.plan import Collective, NetModel, Plan
from commsched.plan.sharding import sharded_plan
from commsched.sim import FittedNetwork, Mode, Network, SimResult, profile_from_document, simulate
from commsched.sim.channel import at_bulk_rate
from commsched.sim.compressed import compress_run, with_shapes
from commsched.sim.floor import schedule_floor
from commsched.sim.network import bulk_seconds_per_wire_byte

from .resample import interval, resampled, round_series, share_at_most


def predict_ms(document: dict, plan: Plan, policy: Policy,
               lossy: LossyCompression | None = None,
               shapes: dict[str, tuple[int, ...]] | None = None,
               allreduce_all_ms: float | None = None) -> float:
    """The simulated iteration of `plan` on the document's profile and fitted network, no
    faster than the link's bulk rate where one all-reduce of every gradient was measured
    (`allreduce_all_ms`: Note [No faster than the link's bulk rate] in sim/network.py). With a
    lossy compressor, the profile gets its wire tensors (laid out as the run lays them out, from
    the parameters' `shapes`) and its measured compute (sim/compressed.py)."""
    return 1e3 * predict(document, plan, policy, lossy, shapes, allreduce_all_ms).iteration_s


def predict(document: dict, plan: Plan, policy: Policy,
            lossy: LossyCompression | None = None,
            shapes: dict[str, tuple[int, ...]] | None = None,
            allreduce_all_ms: float | None = None) -> SimResult:
    """predict_ms's whole simulated iteration; sharded (simulate's `shards`) where the
    profile's updates were (a shard_optimizer run's: its `update_shards`)."""
    mode = Mode.OVERLAP if policy.overlaps_iterations else Mode.SYNC
    fitted = FittedNetwork.from_document(document)
    run = profile_from_document(with_shapes(document, shapes or {}))
    compressed = compress_run(run, lossy, fitted.world_size) if lossy is not None else None
    wired = compressed.run if compressed is not None else run
    shards = run.update_shards
    net: Network = fitted
    if allreduce_all_ms and run.total_bytes > 0:
        bulk = bulk_seconds_per_wire_byte(fitted, run.total_bytes, allreduce_all_ms / 1e3)
        net = at_bulk_rate(wired, sharded_plan(plan) if shards > 1 else plan, fitted, bulk)
    return simulate(wired, plan, net, mode, compressor=compressed.compute if compressed else None,
                    shards=shards)


def floor_summary(document: dict, allreduce_all_ms: float | None = None) -> dict[str, Any]:
    """The floor of any cross-iteration schedule (sim/floor.py) from one candidate's profile.

    The network is the profile's fitted all-reduce, except that with `allreduce_all_ms` (one
    measured all-reduce of every gradient) its per-byte cost is the one that makes that
    all-reduce take what was measured: the fit comes from the profiling plan's blocks, which
    understate bulk transfers: small ones ride a token-bucket-shaped link's burst (Note [The
    bucket's free burst] in scripts/netem.sh), and blocks in flight together split their shared
    time unevenly (service time is counted from the previous block's end)."""
    run = profile_from_document(document)
    net = FittedNetwork.from_document(document)
    if allreduce_all_ms is not None and run.total_bytes > 0:
        alpha = net.allreduce_model().alpha
        beta = max(allreduce_all_ms / 1e3 - alpha, 0.0) / run.total_bytes
        net = FittedNetwork({Collective.ALLREDUCE: NetModel(alpha, beta)}, net.world_size)
    floor = schedule_floor(run, net)
    return {"floor_ms": 1e3 * floor.floor_s, "floor_naive_ms": 1e3 * floor.naive_s,
            "floor_gap_ms": 1e3 * floor.gap_s, "floor_binding": list(floor.binding),
            "floor_module_info": run.has_module_info}


def add_predictions(rows: list[dict[str, Any]], predicted: dict[str, float]) -> None:
    """Adds `predicted_ms` and the relative error |predicted - measured| / measured."""
    for row in rows:
        value = predicted.get(row["name"])
        row["predicted_ms"] = value
        row["prediction_error"] = abs(value - row["median_ms"]) / row["median_ms"] \
            if value is not None else None


AUTO_TOLERANCE = 0.02  # the bound: auto within 2% of the measured-fastest candidate


def auto_verdict(rows: list[dict[str, Any]], auto_label: str, auto_summary: dict) -> dict:
    """How `auto` did against the other commsched candidates of the same job that compress as
    it does (it never changes the compressor it was given): whether it picked the policy of the
    fastest one, and its own median against that one's (knobs included: `auto` may pick the
    fastest policy with other knobs, or another policy and still run as fast)."""
    def compressing(label: str) -> dict[str, Any]:
        return {k: v for k, v in parse_candidate(label)[1].items() if k in COMPRESSION_KNOBS}

    mine = compressing(auto_label)
    measured = {r["name"]: r["median_ms"] for r in rows
                if r["name"].startswith("commsched:") and parse_candidate(r["name"])[0] != "auto"
                and not is_control(r["name"]) and compressing(r["name"]) == mine}
    fastest = min(measured, key=lambda name: measured[name]) if measured else None
    fastest_policy = parse_candidate(fastest)[0] if fastest else None
    own = next((r["median_ms"] for r in rows if r["name"] == auto_label), None)
    ratio = own / measured[fastest] if own is not None and fastest is not None else None
    return {"auto": auto_label,
            "auto_policy": auto_summary.get("policy"), "auto_knobs": auto_summary.get("knobs"),
            "auto_predicted_ms": _ms(auto_summary.get("predicted_s")),
            "auto_measured_in_job_ms": _ms(auto_summary.get("measured_s")),
            "measured_fastest": fastest,
            "measured_fastest_ms": measured[fastest] if fastest is not None else None,
            "picked_fastest": fastest_policy == auto_summary.get("policy"),
            "auto_median_ms": own, "auto_vs_fastest": ratio,
            "auto_within_tolerance": ratio is not None and ratio <= 1 + AUTO_TOLERANCE,
            **_resampled_verdict(rows, auto_label, list(measured)),
            "auto_trials": trial_windows_ms(auto_summary.get("history", [])),
            "auto_ranking": policy_leaders_ms(auto_summary.get("ranking", []))}


def _resampled_verdict(rows: list[dict[str, Any]], auto_label: str,
                       others: list[str]) -> dict[str, Any]:
    """auto against the fastest other candidate over resampled rounds (Note [Resampling whole
    rounds] in resample.py): the interval of the ratio and the share of draws within the
    tolerance; nothing when the rows lack the same rounds."""
    series = round_series(rows, [auto_label, *others]) if others else None
    if series is None:
        return {}
    ratios = resampled(series, lambda medians: medians[auto_label] / min(
        medians[name] for name in others))
    return {"auto_vs_fastest_interval": list(interval(ratios)),
            "auto_within_tolerance_share": share_at_most(ratios, 1 + AUTO_TOLERANCE)}


def trial_windows_ms(history: list[dict]) -> dict[str, list[float]]:
    """Per plan `auto` measured in its trials (Note [Measuring the close calls]), its windows'
    medians in ms, in the order they ran: what its choice rested on."""
    windows: dict[str, list[float]] = {}
    for entry in history:
        if entry.get("why") == "trial" and entry.get("measured_s") is not None:
            windows.setdefault(f"{entry['policy']} {entry['knobs']}", []).append(
                round(1e3 * entry["measured_s"], 1))
    return windows


def policy_leaders_ms(ranking: list) -> dict[str, float]:
    """The best-predicted knob setting of each policy in `auto`'s last ranking, with its
    prediction in ms, best first: what decided which plans its trials measured."""
    leaders: dict[str, float] = {}
    seen: set[str] = set()
    for policy, knobs, predicted_s in ranking:
        if policy not in seen:
            seen.add(policy)
            leaders[f"{policy} {knobs}"] = round(1e3 * predicted_s, 1)
    return leaders


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else 1e3 * seconds
