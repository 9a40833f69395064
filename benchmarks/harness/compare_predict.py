"""`commsched.bench.compare` with its predictions: each commsched candidate simulated from its
own end-of-run profile (the world's: the rank the others waited for, every rank's compute),
`auto`'s verdict, the floor of any cross-iteration schedule, the planner pairs, and the inputs
kept for later re-checks (Note [What ships measures; the repository predicts] in
commsched/bench/compare.py). Takes compare's arguments and --predict / --predict-dir, from the
repository root:

    horovodrun -np 2 --gloo python -m benchmarks.harness.compare_predict --model cnn --predict
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from typing import Any

import commsched
from commsched.bench.candidate import Candidate, parse_candidate
from commsched.bench.compare import RunAnalysis
from commsched.bench.compare import main as compare_main
from commsched.bench.compressed_candidates import lossy_of
from commsched.compression import LossyCompression
from commsched.config import Policy
from commsched.runtime.planning.world_profile import (
    IterationRow,
    critical_rank,
    document_samples,
    waited_s,
    with_world_compute,
    world_compute,
)

from .measured_vs_predicted import add_predictions, auto_verdict, floor_summary, predict_ms
from .planner_pair import compare_pairs
from .prediction_report import prediction_lines


@dataclass(frozen=True)
class PredictionInput:
    """What one commsched candidate's prediction is made from, read once on rank 0: the
    profile as it stands at the end of the run (the settled plan's window; the one
    written when the profiling steps ended still holds warm-up iterations) on the rank the
    others waited for, with every rank's compute (runtime/planning/world_profile.py), the policy
    whose plan it runs (`auto`'s choice for auto), and what a lossy compressor needs."""

    index: int  # position in --candidates: the N of candidate<N>.json
    cand: Candidate
    policy: Policy
    document: dict
    lossy: LossyCompression | None
    shapes: dict[str, tuple[int, ...]]
    rank: int = 0  # whose profile `document` is


@dataclass(frozen=True)
class RankProfile:
    """One rank's end-of-run profile of one candidate, and its sampled iterations (Note [Every
    rank's gradients] in runtime/planning/world_profile.py)."""

    document: dict
    rows: list[IterationRow]


def end_profiles(candidates: list[Candidate]) -> dict[int, list[RankProfile]]:
    """Every rank calls this: each predicted candidate's end-of-run profile on every rank, by
    candidate index."""
    own = {index: RankProfile(cand.optimizer.session.profile_document(),
                              cand.optimizer.session.engine.profiler.iteration_rows())
           for index, cand in enumerate(candidates) if cand.predicted}
    gathered = commsched.init().all_gather_object(own)
    return {index: [ranks[index] for ranks in gathered] for index in own}


def prediction_inputs(candidates: list[Candidate],
                      profiles: dict[int, list[RankProfile]]) -> list[PredictionInput]:
    out = []
    for index, ranks in profiles.items():
        cand = candidates[index]
        named, knobs = parse_candidate(cand.name)
        auto = getattr(cand.optimizer, "auto", None)
        policy = auto.chosen.policy if auto is not None else Policy(named)
        rank = critical_rank([waited_s(document_samples(r.document)) for r in ranks])
        document = with_world_compute(ranks[rank].document,
                                      world_compute([r.rows for r in ranks]))
        out.append(PredictionInput(
            index, cand, policy, document, lossy_of(knobs),
            {n: tuple(p.shape) for n, p in cand.model.named_parameters()}, rank))
    return out


def predictions(inputs: list[PredictionInput], rows: list[dict[str, Any]],
                allreduce_all_ms: float | None = None) -> list[dict]:
    """Rank 0: the simulator's prediction per commsched candidate, no faster than the link's
    bulk rate where `allreduce_all_ms` measured it (measured_vs_predicted.predict_ms); each `auto`
    candidate's pick checked against the measured-fastest policy. `auto` is simulated like the
    others, with the policy it chose; what it predicted when it chose is reported beside its
    pick."""
    predicted, autos = {}, []
    for item in inputs:
        auto = getattr(item.cand.optimizer, "auto", None)
        if auto is not None:
            autos.append((item.cand.name, auto.summary()))
        predicted[item.cand.name] = predict_ms(item.document, item.cand.optimizer.plan,
                                               item.policy, item.lossy, item.shapes,
                                               allreduce_all_ms)
    add_predictions(rows, predicted)
    return [auto_verdict(rows, label, summary) for label, summary in autos]


def keep_prediction_inputs(inputs: list[PredictionInput], directory: str,
                           allreduce_all_ms: float | None) -> None:
    """Rank 0, with --predict-dir: what each prediction was made from (the end-of-run profile
    and whose it is, the installed plan, the policy simulated, the parameters' shapes and the
    measured all-reduce of every gradient) as candidate<N>-end.json, so that a change to the fit
    or the simulator can be checked against a run without running it again."""
    from commsched.plan.serialize import plan_to_dict

    for item in inputs:
        document = {"candidate": item.cand.name, "policy": item.policy.value,
                    "plan": plan_to_dict(item.cand.optimizer.plan), "profile": item.document,
                    "rank": item.rank, "shapes": item.shapes,
                    "allreduce_all_ms": allreduce_all_ms}
        path = os.path.join(directory, f"candidate{item.index}-end.json")
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(document, handle)


def add_floor(rows: list[dict], bound: dict, inputs: list[PredictionInput]) -> dict | None:
    """Rank 0: the floor of any cross-iteration schedule (sim/floor.py) from the profiled
    uncompressed commsched candidates whose profiles know each tensor's first user (the
    overlap policies record it; without it every tensor counts as due at the next backward,
    which hides what synchronous semantics cost), or from all of them when none does, each
    with its network calibrated to the measured all-reduce of every gradient; the lowest of
    them, and never below the measured naive bound (both are lower bounds); and each row's
    distance to it. Returns the profile document it came from.

    The lowest, because each profile measured the compute under its own candidate's traffic:
    on a machine whose ranks share few cores a candidate's communication threads slow its
    forward and backward (the 2-rank CNN's bytescheduler profile gave a floor well above the
    time dear measured, and dear's own profile one just under it; figures:
    benchmarks/notes/README.md, 'add_floor'), and a floor must hold for all of them."""
    from commsched.sim import profile_from_document

    # A compressed candidate's floor would assume its whole gradients on the wire.
    profiled = [item for item in inputs if item.lossy is None]
    if not profiled:
        return None
    with_modules = [item for item in profiled
                    if profile_from_document(item.document).has_module_info]
    floors = [(floor_summary(item.document, bound.get("min_comm_ms")), item)
              for item in with_modules or profiled]
    summary, source = min(floors, key=lambda pair: pair[0]["floor_ms"])
    floor = max(summary["floor_ms"], bound.get("bound_ms") or 0.0)
    bound.update(summary, floor_ms=floor, floor_from=source.cand.name)
    for row in rows:
        row["vs_floor"] = row["median_ms"] / floor if floor else None
    return source.document


class Prediction(RunAnalysis):
    """compare's run analysed by the simulator: --predict, and --predict-dir to keep what each
    prediction was made from."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--predict", action="store_true", help="simulate each commsched "
                            "candidate from its own profile (the world's: the rank the others "
                            "waited for, every rank's compute); report prediction errors and "
                            "the floor")
        parser.add_argument("--predict-dir", default="", help="as --predict, and keep each "
                            "candidate's profile in this directory (candidate<N>.json, when its "
                            "profiling steps ended) and what its prediction was made from "
                            "(candidate<N>-end.json: end-of-run profile, installed plan, policy)")

    def refusal(self, args: argparse.Namespace) -> str | None:
        return None

    def directories(self, args: argparse.Namespace) -> list[tuple[str, str]]:
        return [(args.predict_dir, "--predict-dir")]

    def keeps_profiles(self, args: argparse.Namespace) -> tuple[bool, str]:
        return args.predict or bool(args.predict_dir), args.predict_dir

    def analyse(self, candidates: list[Candidate], wanted: list[str], rows: list[dict],
                bound: dict, args: argparse.Namespace) -> str:
        if not self.keeps_profiles(args)[0]:
            return ""
        profiles = end_profiles(candidates)
        if commsched.rank() != 0:
            return ""
        inputs = prediction_inputs(candidates, profiles)
        bound["auto"] = predictions(inputs, rows, bound.get("min_comm_ms"))
        floor_profile = add_floor(rows, bound, inputs)
        bound["pairs"] = compare_pairs(wanted, [i.document for i in inputs if i.lossy is None],
                                       rows, bound.get("min_comm_ms"))
        if args.predict_dir:
            keep_prediction_inputs(inputs, args.predict_dir, bound.get("min_comm_ms"))
        for verdict in bound["auto"]:
            print(f"auto: {verdict}", flush=True)
        if args.out and floor_profile is not None:  # what the floor came from, to re-check it
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "floor_profile.json"), "w",
                      encoding="utf-8") as handle:
                json.dump(floor_profile, handle, indent=1)
        return prediction_lines(bound)


def main(argv: list[str] | None = None) -> int:
    """compare's main with the predictions (compare's arguments, --predict, --predict-dir)."""
    return compare_main(argv, analysis=Prediction(), module=__spec__.name)


if __name__ == "__main__":
    sys.exit(main())
