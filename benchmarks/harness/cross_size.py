"""A profile taken on one number of ranks predicts a run on another: the check that the scale
sweep (`python -m commsched simulate --workers ...`) rests on, where measurements of both sizes
exist on the same shaped loopback.

Note [Ranks on one shaped loopback]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Here every rank's traffic crosses the one loopback that `scripts/netem.sh` shapes, so the link
is shared, not one per worker as in the sweep. A ring collective on n ranks has each rank send
(n-1)/n of the buffer per phase, n ranks together (n-1) buffers: on a shared link its time
grows as n-1, start-up included (n-1 steps per phase). One all-reduce of every ResNet-50
gradient took twice as long on 3 ranks as on 2 at the same link speed, to within a percent
(the `min_comm_ms` of benchmarks/real/resnet50{,-3ranks}/all). So a profile of n0 ranks
predicts n1 by its fitted collectives times (n1-1)/(n0-1); the reduce-scatter's fit is per
byte of one rank's shard (FittedNetwork), a shard n0/n1 the size, so its per-byte cost also
takes n1/n0. The compute stays the profile's: on n1 ranks the same cores run more processes,
which this does not model. Where both sizes were profiled, each prediction is also made from
the other size's collectives with the predicted size's own compute, which separates the two.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from commsched.bench.candidate import parse_candidate
from commsched.config import Policy, load_config
from commsched.sim import FittedNetwork, profile_from_document
from commsched.sim.rank import PlanCache

from .measured_vs_predicted import predict


def shared_link_factor(ranks_from: int, ranks_to: int) -> float:
    """How much longer every collective takes on `ranks_to` ranks than on `ranks_from` sharing
    one link (Note [Ranks on one shaped loopback]).

    Args:
        ranks_from: the profiled run's ranks, at least 2.
        ranks_to: the predicted run's ranks, at least 2.

    Returns:
        (ranks_to - 1) / (ranks_from - 1).

    Raises:
        ValueError: fewer than 2 ranks on either side (nothing was communicated).
    """
    if ranks_from < 2 or ranks_to < 2:
        raise ValueError(f"a shared link needs 2 or more ranks on both sides, got {ranks_from} "
                         f"and {ranks_to}")
    return (ranks_to - 1) / (ranks_from - 1)


def rescaled_document(document: dict[str, Any], ranks: int) -> dict[str, Any]:
    """The profile document as the same link would give it on `ranks` ranks: its fitted
    collectives rescaled, its compute kept (Note [Ranks on one shaped loopback]).

    Args:
        document: a profile document (docs/profile.md) of 2 or more ranks.
        ranks: the ranks to predict.

    Returns:
        A new document; the fits' samples are left out (they were timed on the old size). A
        shard_optimizer run's profile is sharded among `ranks` ranks.

    Raises:
        ValueError: as shared_link_factor.
    """
    ranks_from = int(document["world_size"])
    factor = shared_link_factor(ranks_from, ranks)
    rescaled = copy.deepcopy(document)
    rescaled["world_size"] = ranks
    for op, fit in rescaled.get("collectives", {}).items():
        per_byte = factor * (ranks / ranks_from if op == "reduce_scatter" else 1.0)
        fit["alpha_s"] *= factor
        fit["beta_s_per_byte"] *= per_byte
        fit.pop("samples", None)
    if rescaled.get("update_shards", 1) > 1:
        # shard_optimizer: each rank stepped 1/ranks_from of the parameters, and steps 1/ranks
        # of them there (its calls' fit, per byte of a shard, holds as it is).
        rescaled["update_shards"] = ranks
        compute = rescaled.get("compute", {})
        if "step_s" in compute:
            compute["step_s"] *= ranks_from / ranks
    return rescaled


def with_collectives_of(document: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """`document` (its compute, its size) with the collectives of `other`, a profile of another
    number of ranks on the same link, rescaled to `document`'s size."""
    rescaled = rescaled_document(other, int(document["world_size"]))
    return {**document, "collectives": rescaled["collectives"]}


@dataclass(frozen=True)
class SizePrediction:
    """One candidate's measured and predicted iteration on both sizes: on the profile's own
    size, on the other (`predicted_to_ms`), and there again with that size's own compute
    (`mixed_to_ms`) and from that size's own profile alone (`own_to_ms`)."""

    candidate: str
    policy: str
    knobs: dict[str, str]
    measured_from_ms: float | None
    predicted_from_ms: float
    measured_to_ms: float
    predicted_to_ms: float
    mixed_to_ms: float
    own_to_ms: float

    @property
    def error(self) -> float:
        """Predicted over measured on the other size, minus 1."""
        return self.predicted_to_ms / self.measured_to_ms - 1.0

    def as_json(self) -> dict[str, Any]:
        """The row, and its errors, for results.json."""
        measured = self.measured_to_ms
        return {"candidate": self.candidate, "policy": self.policy, "knobs": self.knobs,
                "measured_from_ms": self.measured_from_ms,
                "predicted_from_ms": self.predicted_from_ms,
                "measured_to_ms": measured, "predicted_to_ms": self.predicted_to_ms,
                "error": self.error, "mixed_to_ms": self.mixed_to_ms,
                "mixed_error": self.mixed_to_ms / measured - 1.0, "own_to_ms": self.own_to_ms,
                "own_error": self.own_to_ms / measured - 1.0}


def predict_on(document: dict[str, Any], policy: Policy, knobs: dict[str, str], ranks: int,
               allreduce_all_ms: float) -> float:
    """The iteration of `policy` with `knobs`, planned as the run plans it from its profile,
    on `ranks` ranks of the profiled run's shared link.

    Args:
        document: the profile document of the measured size.
        policy: the policy to plan.
        knobs: its knobs as a candidate label writes them (`partition_bytes=2MiB`).
        ranks: the ranks to predict (the profile's own: no rescaling).
        allreduce_all_ms: one all-reduce of every gradient, measured on the profile's size.

    Returns:
        Milliseconds.
    """
    ranks_from = int(document["world_size"])
    target = document if ranks == ranks_from else rescaled_document(document, ranks)
    cfg = load_config({"policy": policy.value, **knobs}, environ={})
    run = profile_from_document(target)
    plan = PlanCache(run, cfg).plan(policy, {key: getattr(cfg, key) for key in knobs},
                                    FittedNetwork.from_document(target))
    result = predict(target, plan, policy,
                     allreduce_all_ms=allreduce_all_ms * shared_link_factor(ranks_from, ranks))
    return 1e3 * result.iteration_s


def cross_size(source: dict[str, Any], target: dict[str, Any],
               profile_of: dict[str, dict[str, Any]],
               target_profile_of: dict[str, dict[str, Any]]) -> list[SizePrediction]:
    """Every commsched candidate of the `target` job predicted from a profile of the `source`
    job (two `compare` reports of the same model and link, different ranks).

    Args:
        source: the profiled job's results.json.
        target: the job to predict, on another number of ranks.
        profile_of: per candidate label, the source profile to predict it from; `auto` is
            predicted as the plan it kept in the target job.
        target_profile_of: per candidate label, a profile of the target job, for its compute.

    Returns:
        One row per commsched candidate of the target job that `profile_of` names.
    """
    ranks_from, ranks_to = source["meta"]["world_size"], target["meta"]["world_size"]
    allreduce_ms = source["bound"]["min_comm_ms"]
    allreduce_to_ms = target["bound"]["min_comm_ms"]
    rescaled_ms = allreduce_ms * shared_link_factor(ranks_from, ranks_to)
    measured_from = {row["name"]: row["median_ms"] for row in source["rows"]}
    kept = {summary["auto"]: summary for summary in target["bound"].get("auto") or []}
    rows = []
    for row in target["rows"]:
        name = row["name"]
        if name not in profile_of:
            continue
        label, knobs = parse_candidate(name)
        if name in kept:
            label = kept[name]["auto_policy"]
            knobs = {key: str(value) for key, value in kept[name]["auto_knobs"].items()}
        policy, document, own = Policy(label), profile_of[name], target_profile_of[name]
        predicted = [predict_on(document, policy, knobs, ranks, allreduce_ms)
                     for ranks in (ranks_from, ranks_to)]
        mixed = predict_on(with_collectives_of(own, document), policy, knobs, ranks_to,
                           rescaled_ms)
        rows.append(SizePrediction(
            name, label, knobs, measured_from.get(name), predicted[0], row["median_ms"],
            predicted[1], mixed, predict_on(own, policy, knobs, ranks_to, allreduce_to_ms)))
    return rows
