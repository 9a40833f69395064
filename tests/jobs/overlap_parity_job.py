"""Runs under ``horovodrun -np N --gloo``: cross-iteration overlap policies against synchronous
hvd.DistributedOptimizer, 20 steps, on a model with a tied weight, a layer used only on even
steps, and evaluation under torch.no_grad() every 5 steps. Writes results to argv[1] on rank 0.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import sys
from typing import Any

import horovod.torch as hvd
import torch
from job_results import gather_and_write, run_case
from torch import nn

import commsched
from commsched.optimizer import _DistributedOptimizer

STEPS = 20
POLICIES = ["bytescheduler", "prophet", "dear"]
CONFIGS = (list(itertools.product(POLICIES, ["sgd", "adam", "adamw_steplr"], [1]))
           + list(itertools.product(POLICIES, ["sgd"], [2])))
KNOBS: dict[str, Any] = {"profile_steps": 2, "partition_bytes": 256, "fusion_threshold": 512,
                         "credit_bytes": 1024}


def config_key(policy: str, kind: str, bpps: int) -> str:
    return f"{policy}-{kind}-bpps{bpps}"


OVERLAP_KEYS = [config_key(*c) for c in CONFIGS]


class TiedNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(20, 8)
        self.conv = nn.Conv1d(8, 8, 3, padding=1)
        self.mid = nn.Linear(8, 8)
        # Reads out_proj.weight without calling out_proj: its update must come before attn runs.
        # No biases: the key bias has a zero true gradient (softmax ignores a shift), so its
        # gradient is rounding noise that Adam scales up to whole steps, and 3-rank summation
        # order differs from Horovod's.
        self.attn = nn.MultiheadAttention(8, 2, bias=False, batch_first=True)
        self.sometimes = nn.Linear(8, 8)  # only on even steps: no gradient on odd ones
        self.head = nn.Linear(8, 20, bias=False)
        self.head.weight = self.embed.weight  # tied, as GPT-2's lm_head and wte

    def forward(self, tokens: torch.Tensor, use_sometimes: bool) -> torch.Tensor:
        x = self.embed(tokens)
        x = torch.relu(self.conv(x.transpose(1, 2))).transpose(1, 2)
        x = torch.relu(self.mid(x))
        x = x + self.attn(x, x, x, need_weights=False)[0]
        if use_sometimes:
            x = x + self.sometimes(x)
        return self.head(x)


def make_optimizer(kind: str, model: nn.Module):
    if kind == "sgd":
        return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3), None
    if kind == "adam":
        return torch.optim.Adam(model.parameters(), lr=1e-2), None
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.05)
    return opt, (lambda wrapped: torch.optim.lr_scheduler.StepLR(wrapped, step_size=4, gamma=0.5))


def tokens(step: int, micro: int, rank: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(97 * step + 7 * micro + rank)
    return torch.randint(0, 20, (3, 6), generator=gen)


EVAL = torch.randint(0, 20, (2, 6), generator=torch.Generator().manual_seed(12345))


def train(wrap, kind: str, bpps: int) -> tuple[nn.Module, list[torch.Tensor], Any]:
    torch.manual_seed(11)
    model = TiedNet()
    base, make_sched = make_optimizer(kind, model)
    opt = wrap(base, model)
    sched = make_sched(opt) if make_sched else None
    evals = []
    for step in range(STEPS):
        opt.zero_grad()
        for micro in range(bpps):
            out = model(tokens(step, micro, hvd.rank()), step % 2 == 0)
            target = tokens(step + 1, micro, hvd.rank()).flatten()
            nn.functional.cross_entropy(out.flatten(0, 1), target).backward()
        opt.step()
        if sched:
            sched.step()
        if step % 5 == 4:
            with torch.no_grad():
                evals.append(model(EVAL, True).clone())
    return model, evals, opt


@functools.cache
def horovod_run(kind: str, bpps: int) -> tuple[nn.Module, list[torch.Tensor]]:
    """Synchronous Horovod's model and evaluations: the same for every policy, so each (kind,
    bpps) is trained once per job (Horovod's waits spin a core, and 3 ranks share 2)."""
    model, evals, _ = train(
        lambda opt, model: hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                                    backward_passes_per_step=bpps), kind, bpps)
    return model, evals


def compare(policy: str, kind: str, bpps: int) -> dict:
    expected, expected_evals = horovod_run(kind, bpps)
    actual, actual_evals, opt = train(
        lambda opt, model: commsched.DistributedOptimizer(
            opt, named_parameters=model.named_parameters(), model=model, policy=policy,
            backward_passes_per_step=bpps, **KNOBS), kind, bpps)
    assert isinstance(opt, _DistributedOptimizer)
    overlapped = opt.session.mode.defers_updates
    opt.flush()
    state_ok = len(opt.state_dict()["state"]) == len(list(actual.parameters()))
    opt.session.close()
    diffs = {n: float((a - b).detach().abs().max()) for (n, a), (_, b) in
             zip(actual.named_parameters(), expected.named_parameters(), strict=True)}
    eval_diff = max(float((a - b).abs().max())
                    for a, b in zip(actual_evals, expected_evals, strict=True))
    ok = all(torch.allclose(a, b, rtol=1e-5, atol=1e-6)
             for a, b in zip(actual.parameters(), expected.parameters(), strict=True))
    ok &= all(torch.allclose(a, b, rtol=1e-5, atol=1e-6)
              for a, b in zip(actual_evals, expected_evals, strict=True))
    return {"ok": bool(ok), "max_diff": max(diffs.values()), "eval_diff": eval_diff,
            "diffs": diffs, "overlapped": overlapped, "state_ok": state_ok,
            "lr": opt.param_groups[0]["lr"]}


def main() -> None:
    torch.set_num_threads(1)
    if os.environ.get("OVERLAP_DUMP_AFTER"):
        import faulthandler

        faulthandler.dump_traceback_later(float(os.environ["OVERLAP_DUMP_AFTER"]), exit=True)
    commsched.init()
    results: dict[str, Any] = {}
    only = os.environ.get("OVERLAP_ONLY")  # debugging: run one configuration
    for config in CONFIGS:
        if only and config_key(*config) not in only.split(","):
            continue
        run_case(results, config_key(*config), functools.partial(compare, *config))
        # Per-rank progress survives a failure of the final gather.
        with open(f"{sys.argv[1]}.rank{hvd.rank()}", "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=1)
    gather_and_write(results, sys.argv[1], "overlap.results")
    commsched.shutdown()


if __name__ == "__main__":
    main()
