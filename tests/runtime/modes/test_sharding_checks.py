"""shard_optimizer's checks at wrap time, in a world of one (they run before any world exists),
and its knob in each of the three places a knob is set."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from helpers import step_alike
from torch import nn

import commsched
from commsched.config import ConfigError, load_config


def _wrap(optimizer: type[torch.optim.Optimizer], **kwargs: Any) -> None:
    model = nn.Linear(3, 2)
    commsched.DistributedOptimizer(optimizer(model.parameters(), lr=0.1),  # type: ignore[call-arg]
                                   named_parameters=model.named_parameters(),
                                   shard_optimizer=True, **kwargs)


@pytest.mark.parametrize("optimizer", [torch.optim.LBFGS, torch.optim.SparseAdam])
def test_an_optimizer_that_needs_whole_parameters_is_refused(
        optimizer: type[torch.optim.Optimizer]) -> None:
    with pytest.raises(TypeError, match=f"cannot shard torch.optim.*{optimizer.__name__}"):
        _wrap(optimizer)


def test_a_subclass_is_refused_too() -> None:
    class Clipped(torch.optim.SGD):  # may take a global norm in its step
        pass

    with pytest.raises(TypeError, match="Clipped"):
        _wrap(Clipped)


@pytest.mark.parametrize("policy", ["bytescheduler", "prophet"])
def test_partitioning_overlap_policies_are_refused_for_now(policy: str) -> None:
    with pytest.raises(ValueError, match=f"not policy '{policy}'"):
        _wrap(torch.optim.SGD, policy=policy)


@pytest.mark.parametrize("compression", [commsched.Compression.fp16,
                                         commsched.Compression.topk(ratio=0.1)])
def test_compression_is_refused(compression: object) -> None:
    with pytest.raises(ValueError, match="cannot run with compression"):
        _wrap(torch.optim.SGD, compression=compression)


def test_a_world_of_one_trains_as_the_plain_optimizer() -> None:
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    twin = nn.Linear(3, 2)
    twin.load_state_dict(model.state_dict())
    opt = commsched.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(),
                                         shard_optimizer=True)
    plain = torch.optim.Adam(twin.parameters(), lr=0.1)
    x = torch.randn(4, 3)
    for _ in range(3):
        step_alike(((model, opt), (twin, plain)), x)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), twin.parameters(),
                                                 strict=True))
    opt.session.close()


@pytest.mark.parametrize(("raw", "value"), [("1", True), ("on", True), ("false", False),
                                            ("No", False)])
def test_the_knob_reads_booleans(raw: str, value: bool, tmp_path: object) -> None:
    assert load_config(environ={"COMMSCHED_SHARD_OPTIMIZER": raw}).shard_optimizer is value
    assert load_config({"shard_optimizer": value}, environ={}).shard_optimizer is value


def test_the_knob_names_a_bad_value() -> None:
    with pytest.raises(ConfigError, match="COMMSCHED_SHARD_OPTIMIZER='2'.*boolean"):
        load_config(environ={"COMMSCHED_SHARD_OPTIMIZER": "2"})



def test_auto_is_accepted_and_the_other_checks_still_hold() -> None:
    _wrap(torch.optim.Adam, policy="auto")
    with pytest.raises(TypeError, match="cannot shard"):
        _wrap(torch.optim.LBFGS, policy="auto")
