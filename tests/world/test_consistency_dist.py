"""Ranks that disagree on the model or the settings get an error naming the difference."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from helpers import distributed_test

pytestmark = pytest.mark.processes


def _mismatch_job() -> dict:
    import torch

    import commsched

    rank = commsched.init().rank
    out = {}
    cases: dict[str, tuple[Callable[[], torch.nn.Module], dict[str, Any]]] = {
        "shape": (lambda: torch.nn.Linear(4, 3 if rank == 0 else 5), {}),
        "policy": (lambda: torch.nn.Linear(4, 3), {"policy": "horovod" if rank == 0 else "ddp"}),
        "knob": (lambda: torch.nn.Linear(4, 3), {"fusion_threshold": 1000 + rank}),
        "order": (lambda: torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 3)), {}),
    }
    for case, (make_model, kwargs) in cases.items():
        model = make_model()
        names = list(model.named_parameters())
        if case == "order" and rank == 1:
            names.reverse()
        try:
            commsched.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                           named_parameters=names, **kwargs)
            out[case] = "no error"
        except commsched.MismatchError as err:
            out[case] = str(err)
    return out


def test_mismatches_are_errors_naming_the_difference() -> None:
    results = distributed_test(_mismatch_job, world_size=2, timeout=90)
    for out in results.values():
        assert "rank 1" in out["shape"] and "weight" in out["shape"] and "[5, 4]" in out["shape"]
        assert "settings" in out["policy"] and "'ddp'" in out["policy"]
        assert "fusion_threshold" in out["knob"]
        # Same parameters, another order: the first position that differs is named.
        assert "entry 0" in out["order"] and "rank 1 has ['1.bias'" in out["order"], out["order"]
        assert "parameters" in out["order"]
