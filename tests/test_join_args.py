"""What commsched.join and commsched.Join refuse, and a world of one, where there is nobody
to answer (commsched/join.py)."""

from __future__ import annotations

import pytest
import torch

import commsched


def _wrapped(uneven_inputs: bool = False) -> commsched.optimizer._DistributedOptimizer:
    model = torch.nn.Linear(3, 2)
    return commsched.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                          named_parameters=model.named_parameters(),
                                          uneven_inputs=uneven_inputs)


def test_join_without_the_knob_says_what_to_set() -> None:
    with pytest.raises(RuntimeError, match=r"uneven_inputs=True .* commsched.Join\(optimizer\)"):
        commsched.join(_wrapped())


def test_join_wants_a_wrapped_optimizer() -> None:
    with pytest.raises(TypeError, match="DistributedOptimizer returned, got SGD"):
        commsched.join(torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1))


def test_a_world_of_one_joins_at_once() -> None:
    opt = _wrapped(uneven_inputs=True)
    assert commsched.join(opt) == 0
    block = commsched.Join(_wrapped())
    with block:
        pass
    assert block.last_joined == 0
