"""The benchmark jobs, as a table (Note [One driver, a table of jobs] in driver.py). Each job's
knobs are environment variables with their defaults, as its script always read them
(`CNN_RATE=2gbit scripts/bench_overlap.sh`); its runs are launches; its report is the README
text written into OUT once every run is done (None: the job's harness writes its own).
"""

from __future__ import annotations

import glob
import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple

Knobs = Mapping[str, str]


class JobError(ValueError):
    """A job's knobs name something it cannot run (the message says which)."""

# compare, with --predict (Note [What ships measures; the repository predicts] in
# commsched/bench/compare.py).
COMPARE = "benchmarks.harness.compare_predict"


class Launcher(Enum):
    """How a run's processes start."""

    PYTHON = "python"  # one process
    HOROVODRUN = "horovodrun"  # horovodrun -np N --gloo python ...
    TORCHRUN = "torchrun"  # torchrun --nproc-per-node=N (it runs python itself)


@dataclass(frozen=True)
class Launch:
    """One run of a job."""

    argv: tuple[str, ...]  # what python (or torchrun) runs: ("-m", module, ...) or a script
    ranks: int = 1
    launcher: Launcher = Launcher.PYTHON
    rate: str | None = None  # the shaped loopback's rate; None: the plain one
    env: tuple[tuple[str, str], ...] = ()  # set for this run only
    log: str = ""  # a file that keeps the run's whole output (every rank's), "" for none


@dataclass(frozen=True)
class Job:
    """One benchmark job: its name, what it measures, its knobs, its runs and its report."""

    name: str
    summary: str
    defaults: dict[str, str]
    launches: Callable[[Knobs], list[Launch]]
    report: Callable[[Knobs], str] | None = None
    netns: str = "csnet"  # the namespace its link is shaped in (another job may hold csnet)
    knob_names: tuple[str, ...] = ()  # knobs the report's command line names
    # What the job does to its folder before its runs (not in a dry run): clear what it rewrites.
    prepare: Callable[[Knobs], None] = lambda _: None
    script: str = ""  # the script its report names, when not scripts/bench_<name>.sh

    def knobs_from(self, environ: Mapping[str, str]) -> dict[str, str]:
        """The job's knobs: each default, unless the environment sets it."""
        return {key: environ.get(key, value) for key, value in self.defaults.items()}

    def netns_from(self, environ: Mapping[str, str]) -> str:
        """The namespace the job shapes: NETNS where the environment sets it."""
        return environ.get("NETNS", self.netns)

    def command_line(self, knobs: Knobs) -> str:
        """How the report says the job was run: its script and the knobs it names."""
        assigned = " ".join(f"{key}={_shell_word(knobs[key])}" for key in self.knob_names)
        return f"{assigned} {self.script or f'scripts/bench_{self.name}.sh'}".strip()


def _shell_word(value: str) -> str:
    return f'"{value}"' if " " in value else value


def compare_run(model: str, batch: int, knobs: Knobs, out: str, candidates: str, *,
                rate: str | None, ranks: int = 2, rounds: int = 8, steps: int = 8,
                warmup: int = 28, extra: tuple[str, ...] = ("--predict",)) -> Launch:
    """One horovodrun job of `compare` (with its predictions) on `model`."""
    note = f"loopback shaped to {rate}" if rate is not None else "unshaped loopback"
    return Launch(("-m", COMPARE, "--model", model, "--batch-size", str(batch),
                   "--rounds", str(rounds), "--steps", str(steps), "--warmup", str(warmup),
                   "--candidates", candidates, *extra, "--link-note", note,
                   "--out", os.path.join(knobs["OUT"], out)),
                  ranks=ranks, launcher=Launcher.HOROVODRUN, rate=rate)


def results_section(path: str) -> str:
    """A run's results.md as a section of the job's README (its title one level down)."""
    with open(path, encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    return "\n".join("#" + line if line.startswith("# ") else line for line in lines)


def _sections(knobs: Knobs, runs: list[str], after: Callable[[str], str] = lambda _: "") -> str:
    text = ""
    for run in runs:
        text += (f"\n{results_section(os.path.join(knobs['OUT'], run, 'results.md'))}\n"
                 f"{after(run)}\n![{run}]({run}/results.png)\n")
    return text


# -- unshaped ------------------------------------------------------------------------------------

UNSHAPED_CANDIDATES = ("local (no comm),hvd,torch-ddp,commsched:horovod,commsched:ddp,"
                       "commsched:mgwfbp,commsched:bytescheduler,commsched:prophet,"
                       "commsched:dear?fusion_threshold=4MiB,commsched:auto")


def _unshaped_runs(knobs: Knobs) -> list[Launch]:
    # 24 rounds of 8 steps: with 4, hvd's CNN median was 64.0 ms in one run and 56.6 ms in the
    # next; with 8, `auto` running the very plan of the mgwfbp candidate measured 2.8% slower
    # than it; with 16, prophet read 1.083x bytescheduler on the CNN with the very same blocks.
    rounds = int(knobs["ROUNDS"])
    return [compare_run(model, batch, knobs, model, UNSHAPED_CANDIDATES, rate=None,
                        rounds=rounds, warmup=30) for model, batch in (("cnn", 16),
                                                                       ("transformer", 8))]


def _unshaped_report(knobs: Knobs) -> str:
    return ("# Unshaped loopback, 2 ranks: every policy against hvd\n\n"
            f"Command: `{UNSHAPED.command_line(knobs)}` (one horovodrun job per model, "
            "candidates interleaved round by round; iteration time = time between the slowest "
            "rank's consecutive step completions; predicted ms: the simulator from each "
            "commsched candidate's own profile).\n"
            + _sections(knobs, ["cnn", "transformer"]))


UNSHAPED = Job("unshaped", "2 ranks on the plain loopback, the CNN and the Transformer: every "
               "policy and auto against hvd and DDP", {"OUT": "benchmarks/unshaped",
                                                       "ROUNDS": "24"},
               _unshaped_runs, _unshaped_report)


# -- overlap -------------------------------------------------------------------------------------

# The second bytescheduler 2 MiB (#control: Note [A control candidate] in
# commsched/bench/candidate.py) is prophet's baseline run twice: prophet against bytescheduler
# is read beside bytescheduler against itself.
OVERLAP_CANDIDATES = (
    "local (no comm),hvd,torch-ddp,commsched:horovod,commsched:mgwfbp,"
    "commsched:bytescheduler?partition_bytes=2MiB&credit_bytes=4MiB,"
    "commsched:bytescheduler?partition_bytes=1MiB&credit_bytes=2MiB,"
    "commsched:prophet?partition_bytes=2MiB&credit_bytes=4MiB,"
    "commsched:bytescheduler?partition_bytes=2MiB&credit_bytes=4MiB#control,"
    "commsched:dear?fusion_threshold=4MiB,commsched:auto")


def _overlap_runs(knobs: Knobs) -> list[Launch]:
    # 28 warm-up steps cover auto's profiling steps and its 20-step check; compare steps `auto`
    # on until its re-plan and trials are over (commsched.bench.compare.settling). 8 rounds of
    # 8 steps: with 3, a median moved by about 2% from run to run, the size of auto's target;
    # with 5, prophet read 1.027x bytescheduler on the Transformer with the very same blocks.
    # 3 ranks share the 2 cores, and their medians move more.
    rounds = int(knobs["ROUNDS"])
    cnn, transformer = knobs["CNN_RATE"], knobs["TRANSFORMER_RATE"]
    return [compare_run("cnn", 64, knobs, "cnn", OVERLAP_CANDIDATES, rate=cnn, rounds=rounds),
            compare_run("transformer", 8, knobs, "transformer", OVERLAP_CANDIDATES,
                        rate=transformer, rounds=rounds),
            compare_run("cnn", 64, knobs, "cnn-3ranks", OVERLAP_CANDIDATES, rate=cnn, ranks=3,
                        rounds=rounds)]


def _overlap_report(knobs: Knobs) -> str:
    return (f"# Overlap benchmark: 2 and 3 ranks, loopback shaped (CNN {knobs['CNN_RATE']}, "
            f"Transformer {knobs['TRANSFORMER_RATE']})\n\n"
            f"Command: `{OVERLAP.command_line(knobs)}` (each model: one horovodrun job, "
            "candidates interleaved round by round; iteration time = time between the slowest "
            "rank's consecutive step completions; steady state: each round starts with one "
            "untimed step and ends with an untimed flush, so every timed step pays for exactly "
            "one earlier iteration's traffic).\n\n"
            "vs floor: the candidate's median over the floor of any cross-iteration schedule "
            "that keeps synchronous semantics (commsched/sim/floor.py, the lowest over the "
            "commsched candidates' profiles that record each tensor's first user, each "
            "profile's compute as measured under its own candidate's traffic and its network "
            "calibrated to the measured all-reduce of every gradient; never below the naive "
            "bound max(compute, one all-reduce of every gradient)).\n"
            + _sections(knobs, ["cnn", "transformer", "cnn-3ranks"]))


OVERLAP = Job("overlap", "2 ranks (and 3 on the CNN) on a shaped loopback: every candidate and "
              "auto, with predictions and the floor",
              {"OUT": "benchmarks/overlap", "CNN_RATE": "1gbit", "TRANSFORMER_RATE": "1gbit",
               "ROUNDS": "8"}, _overlap_runs, _overlap_report,
              knob_names=("CNN_RATE", "TRANSFORMER_RATE"))


# -- compression_speed ---------------------------------------------------------------------------

def _compression_candidates(knobs: Knobs) -> str:
    rank, topk = knobs["RANK"], knobs["TOPK"]
    psgd, topk_knobs = f"compression=powersgd&powersgd_rank={rank}", \
        f"compression=topk&topk_ratio={topk}"
    labels = ["local (no comm)", "hvd", "hvd-fp16", "torch-ddp",
              f"torch-ddp-powersgd?rank={rank}&start_iter=2&min_rate=2"]
    for policy in ("horovod", "ddp", "mgwfbp", "bytescheduler", "prophet", "dear", "auto"):
        labels += [f"commsched:{policy}?{psgd}", f"commsched:{policy}?{topk_knobs}"]
    return ",".join(labels)


def _compression_speed_runs(knobs: Knobs) -> list[Launch]:
    # 5 rounds of 8 steps: with 3, the Transformer's best PowerSGD candidate read 0.87x and
    # 0.91x DDP's hook in two runs on one day. 18 warm-up steps cover commsched's profiling
    # steps, its steady-state re-plan ten steps later and DDP's start_powerSGD_iter.
    return [compare_run(model, batch, knobs, model, _compression_candidates(knobs),
                        rate=knobs["RATE"], rounds=int(knobs["ROUNDS"]),
                        steps=int(knobs["STEPS"]), warmup=18)
            for model, batch in (("cnn", 64), ("transformer", 8))]


def _targets(knobs: Knobs) -> Callable[[str], str]:
    def lines(run: str) -> str:
        from .compression_targets import targets

        with open(os.path.join(knobs["OUT"], run, "results.json"), encoding="utf-8") as handle:
            found = "\n".join(targets(json.load(handle)["rows"]))
        return (f"\nTargets (commsched + PowerSGD rank {knobs['RANK']} at most 0.9x DDP + "
                f"PowerSGD hook and 0.6x hvd):\n\n{found}\n")
    return lines


def _compression_speed_report(knobs: Knobs) -> str:
    return (f"# Compression speed: 2 ranks, loopback shaped to {knobs['RATE']}\n\n"
            f"Command: `{COMPRESSION_SPEED.command_line(knobs)}` (each model: one horovodrun "
            "job, candidates interleaved round by round; iteration time = time between the "
            "slowest rank's consecutive step completions).\n\n"
            "payload MB/iter: what one rank hands to its collectives per iteration (all-reduce: "
            "the buffer; all-gather: its own share); sent MB/iter: what it sends on a ring "
            "(commsched.bench.compressed_candidates). predicted ms: the simulator from the "
            "candidate's own profile, with the compressor's wire tensors and measured compute "
            "(docs/simulator.md).\n"
            + _sections(knobs, ["cnn", "transformer"], _targets(knobs)))


COMPRESSION_SPEED = Job(
    "compression_speed", "2 ranks on a shaped loopback: hvd (fp16), DDP's PowerSGD hook and "
    "every policy with PowerSGD and top-k", {"OUT": "benchmarks/compression_speed",
                                              "RATE": "1gbit", "RANK": "4", "TOPK": "0.01",
                                              "ROUNDS": "5", "STEPS": "8"},
    _compression_speed_runs, _compression_speed_report, netns="cscompress",
    knob_names=("RATE", "RANK", "TOPK"))


# -- kfac_speed ----------------------------------------------------------------------------------

def _kfac_speed_runs(knobs: Knobs) -> list[Launch]:
    return [Launch(("-m", "benchmarks.harness.kfac_speed", "--batch-size", "64", "--warmup",
                    "18", "--rounds", "3", "--steps", "5", "--link-note",
                    f"loopback shaped to {knobs['RATE']}", "--out", knobs["OUT"]),
                   ranks=2, launcher=Launcher.HOROVODRUN, rate=knobs["RATE"])]


def _kfac_speed_report(knobs: Knobs) -> str:
    with open(os.path.join(knobs["OUT"], "results.md"), encoding="utf-8") as handle:
        table = handle.read()
    return ("# K-FAC speed: pipelined + fused + lpt against unpipelined + round_robin\n\n"
            f"Script: `{KFAC_SPEED.command_line(knobs)}` (one horovodrun job in a namespace "
            f"whose loopback is shaped to {knobs['RATE']}; variants interleaved round by round; "
            "iteration time = time between the slowest rank's consecutive step completions)."
            f"\n\n{table}\n"
            "Reading the numbers (arithmetic on the model, not measured): per iteration each "
            "rank sends 17.7 MB of factor upper triangles, 13.0 MB of gradients and one slice "
            "of the decompositions (about 17 MB with lpt), and with 2 ranks every byte crosses "
            "the one shaped loopback. At 1 Gbit/s the factors alone occupy it for about 280 ms. "
            "Pipelining can only move factor traffic into the forward and backward passes, "
            "whose backward half the gradient all-reduce already fills, so it can hide little "
            "more than the forward pass. Placement balances both the d^3 compute (the "
            "2049-wide eigendecomposition alone on one rank) and the bytes each rank "
            "all-gathers.\n\n![results](results.png)\n")


KFAC_SPEED = Job("kfac_speed", "2 ranks on a shaped loopback, the CNN: K-FAC pipelined + fused "
                 "+ lpt against unpipelined + round_robin", {"OUT": "benchmarks/kfac_speed",
                                                              "RATE": "1gbit"},
                 _kfac_speed_runs, _kfac_speed_report, netns="cskfac", knob_names=("RATE",))


# -- one-process harnesses that write their own report -------------------------------------------

def _own_report(module: str) -> Callable[[Knobs], list[Launch]]:
    def runs(knobs: Knobs) -> list[Launch]:
        extra = tuple(shlex.split(knobs["ARGS"])) if knobs.get("ARGS") else ()
        return [Launch(("-m", module, "--out", knobs["OUT"], *extra))]
    return runs


KFAC_CONVERGENCE = Job(
    "kfac_convergence", "one process, scikit-learn's digits: K-FAC + SGD against SGD and Adam, "
    "steps to a target loss", {"OUT": "benchmarks/kfac_convergence", "ARGS": ""},
    _own_report("benchmarks.harness.kfac_convergence"))

COMPRESSION_CONVERGENCE = Job(
    "compression_convergence", "one process, scikit-learn's digits: PowerSGD and top-k against "
    "uncompressed", {"OUT": "benchmarks/compression_convergence", "ARGS": ""},
    _own_report("benchmarks.harness.compression_convergence"))


# -- compile -------------------------------------------------------------------------------------

def _compile_runs(knobs: Knobs) -> list[Launch]:
    import torch

    note = (f"Loopback shaped to {knobs['RATE']}; torch {torch.__version__}, CPU, default "
            "inductor backend.")
    extra = tuple(shlex.split(knobs["ARGS"])) if knobs.get("ARGS") else ()
    return [Launch(("scripts/compile_cost.py", "--out", knobs["OUT"], "--note", note, *extra),
                   ranks=2, launcher=Launcher.TORCHRUN, rate=knobs["RATE"],
                   env=(("BENCH_COMMAND", COMPILE.command_line(knobs)),))]


COMPILE = Job("compile", "2 ranks under torchrun on a shaped loopback, the Transformer: eager "
              "against torch.compile per policy, graph breaks counted",
              {"OUT": "benchmarks/compile", "RATE": "1gbit", "ARGS": ""}, _compile_runs,
              knob_names=("RATE",))


# -- overhead ------------------------------------------------------------------------------------

def _cuda_available() -> bool:
    probe = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
    return subprocess.run([sys.executable, "-c", probe], check=False).returncode == 0


def _overhead_runs(knobs: Knobs) -> list[Launch]:
    # 4 builds of every candidate, 10 rounds each (Note [Builds of the candidates] in
    # benchmarks/harness/overhead.py); 110 warm-up steps: a world of one steps as the plain
    # optimizer from about iteration 80 (every policy) or 100 (`auto`) on (Note [A world of one
    # steps as the plain optimizer] in commsched/runtime/modes/plain.py).
    env = (("OVERHEAD_COMMAND", OVERHEAD.command_line(knobs)),)
    common = ("--instances", knobs["INSTANCES"], "--rounds", knobs["ROUNDS"], "--warmup",
              knobs["WARMUP"])
    runs = [Launch(("-m", "benchmarks.harness.overhead", "--device", "cpu", *common, "--out",
                    os.path.join(knobs["OUT"], "cpu")), env=env)]
    if _cuda_available():
        runs.append(Launch(("-m", "benchmarks.harness.overhead", "--device", "cuda",
                            "--free-running", *common, "--out",
                            os.path.join(knobs["OUT"], "gpu")), env=env))
    else:
        print("bench: overhead: no GPU here (torch.cuda.is_available() is false): GPU part not "
              "run", file=sys.stderr)
    return runs


OVERHEAD = Job("overhead", "a world of one: every policy and auto beside the plain optimizer "
               "(and on a GPU where one is)", {"OUT": "benchmarks/overhead", "INSTANCES": "4",
                                               "ROUNDS": "10", "WARMUP": "110"},
               _overhead_runs)


# -- replay_overhead -----------------------------------------------------------------------------

# In a world of one a policy steps as the plain optimizer once settled; with its engine kept it
# pays what it pays beside peers (Note [The engine kept] in overhead_report.py).
REPLAY_CANDIDATES = ",".join(f"{policy} (engine kept)" for policy in (
    "horovod", "ddp", "mgwfbp", "bytescheduler", "prophet", "dear")) + ",auto"


def _replay_overhead_runs(knobs: Knobs) -> list[Launch]:
    models = ",".join(f"profile:benchmarks/cluster/profiles/{name}.json?k={knobs['K']}"
                      for name in knobs["MODELS"].split())
    return [Launch(("-m", "benchmarks.harness.overhead", "--device", "cpu", "--models", models,
                    "--optimizer", "sgd", "--policies", REPLAY_CANDIDATES, "--instances",
                    knobs["INSTANCES"], "--rounds", knobs["ROUNDS"], "--warmup",
                    knobs["WARMUP"], "--out", knobs["OUT"]),
                   env=(("OVERHEAD_COMMAND", REPLAY_OVERHEAD.command_line(knobs)),))]


REPLAY_OVERHEAD = Job(
    "replay_overhead", "a world of one replaying ResNet-50, BERT and GPT-2 at a GPU's pace "
    "(the testbed's profiles): every policy, its engine kept, beside the plain optimizer",
    {"OUT": "benchmarks/cluster/overhead", "MODELS": "resnet50 bert gpt2", "K": "256",
     "INSTANCES": "2", "ROUNDS": "10", "WARMUP": "110"}, _replay_overhead_runs,
    knob_names=("MODELS", "K"))


# -- real ----------------------------------------------------------------------------------------

REAL_SYNC = "commsched:horovod,commsched:mgwfbp"
REAL_OVERLAP = ("commsched:bytescheduler?partition_bytes=2MiB&credit_bytes=4MiB,"
                "commsched:prophet?partition_bytes=2MiB&credit_bytes=4MiB,"
                "commsched:dear?fusion_threshold=4MiB")
REAL_AUTO_ALONE = "hvd,commsched:dear?fusion_threshold=4MiB,commsched:auto?auto_trials=0"
# Per model: its batch, its rate's knob and its jobs (group, candidates). A model over 100 M
# parameters holds a copy of itself, its gradients and SGD's momentum per candidate and rank
# (docs/examples.md), so its candidates run in groups of at most five, each group one job with
# `hvd` in it. `auto` without trials (auto_trials=0: the prediction alone decides) on GPT-2 and
# BERT: their trials take some 400 steps, over 20 minutes at 3-4 s per step here; VGG-16's
# (about 1.3 s per step at 10 Gbit/s) fit a run.
REAL_MODELS: dict[str, tuple[int, str, tuple[tuple[str, str], ...]]] = {
    "resnet50": (8, "RESNET50_RATE", (
        ("all", f"local (no comm),hvd,torch-ddp,{REAL_SYNC},{REAL_OVERLAP},commsched:auto"),)),
    "vgg16": (8, "VGG16_RATE", (
        ("synchronous", f"local (no comm),hvd,torch-ddp,{REAL_SYNC}"),
        ("overlap", f"hvd,{REAL_OVERLAP}"),
        ("auto", "hvd,commsched:dear?fusion_threshold=4MiB,commsched:auto"))),
    "bert": (2, "BERT_RATE", (
        ("synchronous", f"local (no comm),hvd,torch-ddp,{REAL_SYNC}"),
        ("overlap", f"hvd,{REAL_OVERLAP}"), ("auto", REAL_AUTO_ALONE))),
    "gpt2": (1, "GPT2_RATE", (
        ("synchronous", f"local (no comm),hvd,torch-ddp,{REAL_SYNC}"),
        ("overlap", f"hvd,{REAL_OVERLAP}"), ("auto", REAL_AUTO_ALONE))),
}


def _real_runs(knobs: Knobs) -> list[Launch]:
    # 8 warm-up steps, then compare steps each commsched candidate on, untimed, until its plan
    # settles (commsched.bench.compare.settling).
    suffix = "" if knobs["RANKS"] == "2" else f"-{knobs['RANKS']}ranks"
    groups = knobs["JOBS"].split()
    runs = []
    for model in knobs["MODELS"].split():
        if model not in REAL_MODELS:
            raise JobError(f"no jobs for model {model!r} ({', '.join(REAL_MODELS)})")
        batch, rate_knob, jobs = REAL_MODELS[model]
        runs += [compare_run(model, batch, knobs, f"{model}{suffix}/{group}", candidates,
                             rate=knobs[rate_knob], ranks=int(knobs["RANKS"]),
                             rounds=int(knobs["ROUNDS"]), steps=4, warmup=8)
                 for group, candidates in jobs if group in groups]
    return runs + [Launch(("scripts/real_report.py", knobs["OUT"], "--command",
                           REAL.command_line(knobs)))]


REAL = Job("real", "ResNet-50, VGG-16, BERT-base and GPT-2 at full size on a shaped loopback: "
           "every policy against hvd and DDP, with the floor",
           {"OUT": "benchmarks/real", "MODELS": "resnet50 gpt2", "RANKS": "2",
            "RESNET50_RATE": "2gbit", "GPT2_RATE": "6gbit", "VGG16_RATE": "10gbit",
            "BERT_RATE": "3gbit", "ROUNDS": "4", "JOBS": "all synchronous overlap auto"},
           _real_runs, knob_names=("MODELS", "JOBS", "RANKS", "RESNET50_RATE", "GPT2_RATE",
                                   "VGG16_RATE", "BERT_RATE", "ROUNDS"))


# -- zoo -----------------------------------------------------------------------------------------

# Every policy at its defaults, as a user who names one gets it: the zoo asks which policy loses
# on a model nobody tuned for, not how fast a tuned one can be.
ZOO_CANDIDATES = ("local (no comm),hvd,torch-ddp,commsched:horovod,commsched:ddp,"
                  "commsched:mgwfbp,commsched:bytescheduler,commsched:prophet,commsched:dear,"
                  "commsched:auto")


class ZooArchitecture(NamedTuple):
    """One architecture of the zoo."""

    kind: str  # what it is, for the report
    spec: str  # as `compare --model` takes it (commsched.bench.any_model)
    # The link at which hvd waits about half its iteration on 2 ranks at ZOO_BATCH (a short run
    # of `local (no comm)` and hvd at 1 Gbit/s set each: hvd waited 43-76% there).
    rate: str


ZOO_MODELS: dict[str, ZooArchitecture] = {
    "gpt2": ZooArchitecture(
        "decoder, tied head", "hf:gpt2?n_layer=4&n_embd=256&n_head=4&vocab_size=8192",
        "1.2gbit"),
    "opt": ZooArchitecture(
        "decoder, tied head, learned positions",
        "hf:opt?num_hidden_layers=4&hidden_size=256&ffn_dim=1024&num_attention_heads=4"
        "&word_embed_proj_dim=256&vocab_size=8192", "1.2gbit"),
    "llama": ZooArchitecture(
        "decoder, untied head, grouped-query attention",
        "hf:llama?num_hidden_layers=4&hidden_size=256&intermediate_size=688"
        "&num_attention_heads=4&num_key_value_heads=2&vocab_size=8192", "1.6gbit"),
    "mixtral": ZooArchitecture(
        "decoder with mixture-of-experts layers (4 experts, 2 per token)",
        "hf:mixtral?num_hidden_layers=2&hidden_size=256&intermediate_size=512"
        "&num_attention_heads=4&num_key_value_heads=2&num_local_experts=4"
        "&num_experts_per_tok=2&vocab_size=8192", "2.5gbit"),
    "t5": ZooArchitecture(
        "encoder-decoder, relative positions",
        "hf:t5?num_layers=3&d_model=256&d_ff=1024&num_heads=4&d_kv=64&vocab_size=8192", "1gbit"),
    "bart": ZooArchitecture(
        "encoder-decoder, one embedding shared by encoder, decoder and head",
        "hf:bart?encoder_layers=3&decoder_layers=3&d_model=256&encoder_ffn_dim=1024"
        "&decoder_ffn_dim=1024&encoder_attention_heads=4&decoder_attention_heads=4"
        "&vocab_size=8192", "1gbit"),
    "vit": ZooArchitecture(
        "vision transformer, 64x64 images in 8x8 patches",
        "hf:vit?num_hidden_layers=6&hidden_size=256&intermediate_size=1024"
        "&num_attention_heads=4&image_size=64&patch_size=8", "1gbit"),
    "mobilenet_v2": ZooArchitecture(
        "CNN of many small layers (depthwise convolutions)", "hf:mobilenet_v2?image_size=96",
        "600mbit"),
}
ZOO_BATCH = 4


def _zoo_models(knobs: Knobs) -> list[str]:
    names = knobs["MODELS"].split()
    unknown = [name for name in names if name not in ZOO_MODELS]
    if unknown:
        raise JobError(f"no zoo architecture {', '.join(map(repr, unknown))} "
                       f"({', '.join(ZOO_MODELS)})")
    return names


def _zoo_rate_knob(name: str) -> str:
    return f"RATE_{name.upper()}"


def _zoo_runs(knobs: Knobs) -> list[Launch]:
    runs = [] if knobs["REPORT_ONLY"] == "1" else [
        compare_run(ZOO_MODELS[name].spec, ZOO_BATCH, knobs, name, ZOO_CANDIDATES,
                    rate=knobs[_zoo_rate_knob(name)], rounds=int(knobs["ROUNDS"]), steps=4,
                    warmup=8)
        for name in _zoo_models(knobs)]
    return runs + [Launch(("-m", "benchmarks.harness.zoo_report", knobs["OUT"], "--command",
                           ZOO.command_line(knobs)))]


ZOO = Job("zoo", "eight architectures nobody tuned for, from transformers configs, 2 ranks on "
          "a link where hvd waits about half its iteration: every policy at its defaults "
          "against hvd and DDP, with the floor",
          {"OUT": "benchmarks/zoo", "MODELS": " ".join(ZOO_MODELS), "ROUNDS": "4",
           "REPORT_ONLY": "0",
           **{_zoo_rate_knob(name): arch.rate for name, arch in ZOO_MODELS.items()}},
          _zoo_runs, knob_names=("MODELS", "ROUNDS",
                                 *(_zoo_rate_knob(name) for name in ZOO_MODELS)))


# -- collectives ---------------------------------------------------------------------------------

def _collectives_note(knobs: Knobs) -> str:
    rate = knobs["RATE"]
    return "plain loopback" if rate == "none" else f"loopback shaped to {rate}"


def _collectives_runs(knobs: Knobs) -> list[Launch]:
    rate = None if knobs["RATE"] == "none" else knobs["RATE"]
    note, out = _collectives_note(knobs), knobs["OUT"]
    ranks = knobs["RANKS"].split()
    runs = [Launch(("-m", "benchmarks.harness.collectives", "--rounds", knobs["ROUNDS"],
                    "--out", f"{out}/ranks{n}", "--note", note), ranks=int(n),
                   launcher=Launcher.TORCHRUN, rate=rate) for n in ranks]
    return runs + [Launch(("-m", "benchmarks.harness.collectives", "--out", out, "--note", note,
                           "--merge", *[f"{out}/ranks{n}" for n in ranks]))]


def _collectives_report(knobs: Knobs) -> str:
    with open(os.path.join(knobs["OUT"], "results.md"), encoding="utf-8") as handle:
        table = "\n".join(handle.read().splitlines()[2:])
    return ("# Collectives on Gloo: torch's reduce-scatter and all-gather against the engine's "
            "ring\n\n"
            f"Command: `{COLLECTIVES.command_line(knobs)}` ({_collectives_note(knobs)}; float32 "
            "buffers; each figure the median over rounds of the slowest rank's mean time over 3 "
            "calls; sizes and operations interleaved within each round).\n\n"
            f"{table}\n\n![ratios](results.png)\n")


COLLECTIVES = Job("collectives", "Gloo's all-reduce, reduce-scatter and all-gather against the "
                  "engine's ring, 64 KiB to 64 MiB, on 2, 3 and 4 ranks",
                  {"OUT": "benchmarks/collectives", "RATE": "1gbit", "RANKS": "2 3 4",
                   "ROUNDS": "3"}, _collectives_runs, _collectives_report,
                  knob_names=("RATE", "RANKS", "ROUNDS"))


# -- shard ---------------------------------------------------------------------------------------

def _shard_parts(knobs: Knobs) -> list[str]:
    part = knobs.get("ARGS") or "all"
    if part not in ("all", "memory", "speed"):
        raise JobError(f"no part {part!r} (memory, speed, or none for both)")
    return ["memory", "speed"] if part == "all" else [part]


def _shard_prepare(knobs: Knobs) -> None:
    out = knobs["OUT"]
    os.makedirs(os.path.join(out, "speed"), exist_ok=True)
    parts = _shard_parts(knobs)
    if "memory" in parts:
        if os.path.exists(os.path.join(out, "memory.jsonl")):
            os.remove(os.path.join(out, "memory.jsonl"))
        _write(os.path.join(out, "memory_command.txt"),
               f"MODELS={_shell_word(knobs['MODELS'])} RANKS={_shell_word(knobs['RANKS'])} "
               "scripts/bench_shard.sh memory\n")
    if "speed" in parts:
        _write(os.path.join(out, "speed_command.txt"),
               f"SPEED_RATE={knobs['SPEED_RATE']} ROUNDS={knobs['ROUNDS']} "
               "scripts/bench_shard.sh speed\n")


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


def _shard_runs(knobs: Knobs) -> list[Launch]:
    # memory: one job per model, mode (plain dear, sharded dear, torch-zero: DDP with torch's
    # ZeroRedundancyOptimizer) and world size, unshaped: the optimizer state each rank holds
    # and its peak RSS. speed: 2 ranks at SPEED_RATE, ResNet-50, every candidate in one job.
    parts, out, runs = _shard_parts(knobs), knobs["OUT"], []
    if "memory" in parts:
        runs += [Launch(("-m", "benchmarks.harness.shard_memory", "--model", model, "--mode",
                         mode, "--out", os.path.join(out, "memory.jsonl")), ranks=int(ranks),
                        launcher=Launcher.HOROVODRUN)
                 for model in knobs["MODELS"].split() for ranks in knobs["RANKS"].split()
                 for mode in ("plain", "sharded", "torch-zero")]
    if "speed" in parts:
        dear = "commsched:dear?fusion_threshold=4MiB"
        runs.append(compare_run(
            "resnet50", 8, knobs, "speed", f"hvd,torch-ddp,torch-zero,{dear},"
            f"{dear}&shard_optimizer=1,{dear}#control", rate=knobs["SPEED_RATE"],
            rounds=int(knobs["ROUNDS"]), steps=4, warmup=8,
            extra=("--optimizer", "adam", "--memory")))
    return runs + [Launch(("scripts/shard_report.py", out))]


SHARD = Job("shard", "shard_optimizer with Adam: the state each rank holds and its peak RSS "
            "(memory), and its speed on ResNet-50 at 1 Gbit/s (speed)",
            {"OUT": "benchmarks/shard", "MODELS": "resnet50 vgg16 bert gpt2", "RANKS": "2 3",
             "SPEED_RATE": "1gbit", "ROUNDS": "4", "ARGS": ""}, _shard_runs,
            prepare=_shard_prepare)


# -- scale ---------------------------------------------------------------------------------------

SCALE_CANDIDATES = ("local (no comm),commsched:horovod,commsched:ddp,"
                    "commsched:dear?fusion_threshold=4MiB")
SCALE_BATCH = {"resnet50": 8, "vgg16": 8, "bert": 4, "gpt2": 4}


def _scale_prepare(knobs: Knobs) -> None:
    if knobs["SIMULATE_ONLY"]:
        return
    for model in knobs["MODELS"].split():
        folder = os.path.join(knobs["OUT"], model)
        if os.path.isdir(folder):
            shutil.rmtree(folder)
        os.makedirs(folder)


def _scale_runs(knobs: Knobs) -> list[Launch]:
    # 1. one 2-rank torchrun job per model on the plain loopback, the commsched candidates'
    # profiles kept (--predict-dir); four candidates of a 110-138 M parameter model per rank fit
    # this 24 GB machine (docs/examples.md). 2. the simulator's sweep from the `dear`
    # candidate's profile (candidate3: its index in SCALE_CANDIDATES): an overlap policy's
    # profile records the forward modules the overlap policies' predictions need.
    runs = []
    for model in knobs["MODELS"].split():
        if model not in SCALE_BATCH:
            raise JobError(f"no batch for model {model!r} ({', '.join(SCALE_BATCH)})")
        folder = os.path.join(knobs["OUT"], model)
        if not knobs["SIMULATE_ONLY"]:
            runs.append(Launch(("-m", COMPARE, "--model", model, "--batch-size",
                                str(SCALE_BATCH[model]), "--candidates", SCALE_CANDIDATES,
                                "--warmup", "8", "--rounds", "3", "--steps", "4",
                                "--predict-dir", f"{folder}/profiles", "--link-note",
                                "loopback, unshaped", "--out", f"{folder}/measured"),
                               ranks=2, launcher=Launcher.TORCHRUN,
                               log=f"{folder}/measured.log"))
        runs.append(Launch(("-m", "commsched", "simulate", "--profile",
                            f"{folder}/profiles/candidate3.json", "--workers", knobs["WORKERS"],
                            "--bandwidth", knobs["BANDWIDTHS"], "--latency", "20us",
                            "--algorithm", "ring", "--policy", "all", "--compression",
                            "1,powersgd:4", "--json", f"{folder}/results.json", "--plot",
                            f"{folder}/scaling.png", "--markdown", f"{folder}/table.md"),
                           log=os.devnull))
    return runs + [Launch(("scripts/scale_report.py", knobs["OUT"], *knobs["MODELS"].split(),
                           "--command", SCALE.command_line(knobs)))]


SCALE = Job("scale", "each real model measured on 2 ranks of the plain loopback, then the "
            "simulator's sweep from its profile: 8 to 256 workers, 1 to 100 Gbit/s",
            {"OUT": "benchmarks/scale", "MODELS": "resnet50 vgg16 bert gpt2",
             "WORKERS": "8,16,32,64,128,256", "BANDWIDTHS": "1gbit,10gbit,25gbit,100gbit",
             "SIMULATE_ONLY": ""}, _scale_runs, prepare=_scale_prepare,
            knob_names=("MODELS", "WORKERS", "BANDWIDTHS"))


# -- sim -----------------------------------------------------------------------------------------

SIM_CANDIDATES = (
    "local (no comm),hvd,commsched:horovod,commsched:ddp,commsched:mgwfbp,"
    "commsched:bytescheduler?partition_bytes=2MiB&credit_bytes=4MiB,"
    "commsched:prophet?partition_bytes=2MiB&credit_bytes=4MiB,"
    "commsched:dear?fusion_threshold=4MiB,commsched:auto")
SIM_SHARDED_CANDIDATES = (
    "commsched:horovod,commsched:horovod?shard_optimizer=1,commsched:ddp?shard_optimizer=1,"
    "commsched:mgwfbp?shard_optimizer=1,commsched:dear?fusion_threshold=4MiB,"
    "commsched:dear?fusion_threshold=4MiB&shard_optimizer=1,commsched:auto?shard_optimizer=1")


def _sim_settings(knobs: Knobs) -> tuple[list[tuple[str, int, int, str, str]],
                                          list[tuple[str, int, int, str, str]]]:
    """(model, batch, ranks, rate, folder) of the policies' settings and the sharded ones."""
    out, policies = knobs["OUT"], []
    for rate in knobs["RATES"].split():
        specs = [("cnn", 64, 2), ("transformer", 8, 2)]
        if rate == knobs["THREE_RANKS_RATE"]:
            specs.append(("cnn", 64, 3))
        policies += [(model, batch, ranks, rate, f"{out}/{model}-{rate}"
                      + ("" if ranks == 2 else f"-{ranks}ranks"))
                     for model, batch, ranks in specs]
    rate = knobs["SHARDED_RATE"]
    sharded = [(model, batch, ranks, rate, f"{out}/sharded-{model}-{rate}"
                + ("" if ranks == 2 else f"-{ranks}ranks"))
               for model, batch, ranks in (("cnn", 64, 2), ("transformer", 8, 2), ("cnn", 64, 3))]
    return policies, sharded


def _sim_runs(knobs: Knobs) -> list[Launch]:
    # 8 rounds of 8 steps: with 2, the 2 Gbit/s CNN's overlap candidates measured 11-18% above
    # their predictions in one run, and bytescheduler 10% below its own in the next; with 5,
    # the worst of the 35 predictions read 12.6%, 6.4%, 13.7% and 8.9% in four runs in a row.
    # 28 warm-up steps per candidate cover its profiling steps and its 20-step check.
    if knobs["REPORT_ONLY"] == "1":
        return []
    parts, (policies, sharded), runs = knobs["PARTS"].split(), _sim_settings(knobs), []
    rounds = int(knobs["ROUNDS"])
    if "policies" in parts:
        runs += [compare_run(model, batch, knobs, os.path.relpath(folder, knobs["OUT"]),
                             SIM_CANDIDATES, rate=rate, ranks=ranks, rounds=rounds,
                             extra=("--predict-dir", f"{folder}/predict"))
                 for model, batch, ranks, rate, folder in policies]
    if "sharded" in parts:
        runs += [compare_run(model, batch, knobs, os.path.relpath(folder, knobs["OUT"]),
                             SIM_SHARDED_CANDIDATES, rate=rate, ranks=ranks, rounds=rounds,
                             extra=("--optimizer", "adam", "--memory", "--predict-dir",
                                    f"{folder}/predict"))
                 for model, batch, ranks, rate, folder in sharded]
    return runs


def _sim_report(knobs: Knobs) -> str:
    from .sim_validation import summary_markdown

    policies, sharded = (
        [f"{folder}/results.json" for *_, folder in settings] for settings in _sim_settings(knobs))
    text = (f"# Simulator validation: predicted vs measured iteration time, 2 ranks (and 3 on "
            f"the CNN at {knobs['THREE_RANKS_RATE']})\n\n"
            f"Command: `{SIM.command_line(knobs)}`. {SIM_METHOD}\n\n"
            + summary_markdown(policies) + "\n")
    compressed = sorted(glob.glob("benchmarks/compression_speed/*/results.json"))
    if compressed:
        text += ("\n## Compressed runs\n\nThe runs of benchmarks/compression_speed "
                 "(`scripts/bench_compression_speed.sh`, 2 ranks at 1 Gbit/s), each compressed "
                 "plan simulated with the compressor's own wire tensors and measured compute "
                 "(sim/compressed.py) instead of a bare ratio; target: within 15%.\n\n"
                 + summary_markdown(compressed) + "\n")
    if os.path.exists(sharded[0]):
        text += (f"\n## Sharded runs\n\n`shard_optimizer=True` (docs/sharding.md) with Adam at "
                 f"{knobs['SHARDED_RATE']}, `PARTS=sharded scripts/bench_sim.sh`: each sharded "
                 "plan simulated from its own run's profile, whose `update_shards` says its "
                 "updates were of slices (sim/sharded.py: the sharded plan's reduce-scatters and "
                 "all-gathers, one optimizer call per block on 1/N of it), beside the unsharded "
                 "horovod and dear of the same job; target: within 15%.\n\n"
                 + summary_markdown(sharded) + "\n")
    for result in policies + sharded:
        table = os.path.join(os.path.dirname(result), "results.md")
        if os.path.exists(table):
            text += "\n" + results_section(table) + "\n"
    return text


SIM_METHOD = (
    "Each setting is one horovodrun job (candidates interleaved, steady-state medians as in "
    "benchmarks/overlap); each commsched plan is simulated (`commsched.sim`, fitted α/β per "
    "collective, synchronous or cross-iteration mode) from that candidate's own profile as it "
    "stands at the end of the run, the world's (the collectives of the rank the others waited "
    "for, whose took the least time in all, and each gradient ready when the last rank had it, "
    "iteration by iteration: Note [The rank the others wait for] and Note [Every rank's "
    "gradients] in `runtime/planning/world_profile.py`; the profiler keeps the latest "
    "iterations; the first ones are warm-up: a Transformer's backward ran 4x slower for about "
    "ten steps). `auto` is simulated the same way with the plan it installed (its own "
    "prediction when it chose is in the line below each table); an iteration's collectives are "
    "never predicted to move their wire bytes faster than the link's bulk rate, from the "
    "all-reduce of every gradient each job measures (one block may) (Note [No faster than the "
    "link's bulk rate] in `sim/network.py`); each setting's `predict/` keeps what its "
    "predictions were made from. 28 warm-up steps per candidate cover its profiling steps and "
    "its 20-step check, and `auto` steps on, untimed, until its re-plan and trials of close "
    "runners-up are over.")

SIM = Job("sim", "the simulator's predictions against measured medians: every policy and auto, "
          "the CNN and the Transformer at two rates (and sharded with Adam)",
          {"OUT": "benchmarks/sim_validation", "RATES": "1gbit 2gbit",
           "THREE_RANKS_RATE": "1gbit", "PARTS": "policies sharded", "SHARDED_RATE": "1gbit",
           "ROUNDS": "8", "REPORT_ONLY": "0"}, _sim_runs, _sim_report,
          knob_names=("RATES", "THREE_RANKS_RATE"))

JOBS: dict[str, Job] = {job.name: job for job in (
    UNSHAPED, OVERLAP, COMPRESSION_SPEED, KFAC_SPEED, KFAC_CONVERGENCE, COMPRESSION_CONVERGENCE,
    COMPILE, OVERHEAD, REPLAY_OVERHEAD, REAL, ZOO, COLLECTIVES, SHARD, SCALE, SIM)}
