"""A large update group stepped piece by piece as its partitions land (Note [A large group is
updated piece by piece] in commsched/runtime/modes/overlap/piecewise.py): the pieces a plan gives
(pure), and
training in a world of one under `bytescheduler` against the synchronous `horovod`, which must
agree bit for bit, state included."""

from __future__ import annotations

import io
from typing import Any

import pytest
import torch
from torch import nn

import commsched
from commsched.plan import Block, Collective, Piece, Plan, Stage
from commsched.plan import pieces as plan_pieces
from commsched.plan.pieces import UpdatePiece, group_pieces
from commsched.runtime.modes.overlap import piecewise

FLOAT = 4


def _params(*numels: int) -> list[tuple[int, int]]:
    return [(n, FLOAT) for n in numels]


def _block(block_id: int, *pieces: tuple[int, int, int],
           op: Collective = Collective.ALLREDUCE) -> Block:
    return Block(block_id, tuple(Piece(*p) for p in pieces), "float32", op=op,
                 stage=Stage.BACKWARD)


def test_a_partitioned_group_is_cut_in_plan_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pieces close once they hold PIECE_BYTES; a tensor's adjacent partitions merge; another
    group's tensor in a shared block is no part of it."""
    monkeypatch.setattr(plan_pieces, "PIECE_BYTES", 8 * FLOAT)
    params = _params(12, 4, 100)
    plan = Plan("bytescheduler", (_block(0, (1, 0, 4), (2, 0, 50)),  # tensor 2: another group
                                  _block(1, (0, 0, 4)), _block(2, (0, 4, 4)),
                                  _block(3, (0, 8, 4), (2, 50, 50))))
    slot_of = {0: 0, 1: 1, 2: 2}
    assert group_pieces(plan, (0, 1), slot_of, params) == (
        UpdatePiece((0, 1), ((0, 0, 4), (1, 0, 4))),
        UpdatePiece((2, 3), ((0, 4, 12),)))


def test_small_groups_and_reduce_scatters_are_stepped_whole(
        monkeypatch: pytest.MonkeyPatch) -> None:
    params = _params(12)
    split = (_block(0, (0, 0, 6)), _block(1, (0, 6, 6)))
    assert group_pieces(Plan("bytescheduler", split), (0,), {0: 0}, params) == ()  # too small
    monkeypatch.setattr(plan_pieces, "PIECE_BYTES", 6 * FLOAT)
    assert len(group_pieces(Plan("bytescheduler", split), (0,), {0: 0}, params)) == 2
    scattered = (split[0], _block(1, (0, 6, 6), op=Collective.REDUCE_SCATTER))
    assert group_pieces(Plan("dear", scattered), (0,), {0: 0}, params) == ()


# -- training in a world of one ----------------------------------------------------------------

def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 96), nn.ReLU(),
                         nn.Linear(96, 10))


def _train(policy: str, opt_cls: type, steps: int = 8, reload_at: int | None = None,
           **hyper: Any) -> tuple[list[torch.Tensor], dict[str, Any]]:
    """`reload_at`: the optimizer saves and loads its state_dict before that step (new state
    tensors, which the slices must be cut from again)."""
    model = _model()
    opt = commsched.DistributedOptimizer(
        opt_cls(model.parameters(), lr=0.01, **hyper), named_parameters=model.named_parameters(),
        policy=policy, model=model, profile_steps=2, partition_bytes=4096, credit_bytes=8192)
    for step in range(steps):
        if step == reload_at:
            opt.flush()
            buffer = io.BytesIO()
            torch.save(opt.state_dict(), buffer)
            buffer.seek(0)
            opt.load_state_dict(torch.load(buffer, weights_only=False))
        opt.zero_grad()
        batch = torch.randn(16, 64, generator=torch.Generator().manual_seed(step))
        model(batch).square().mean().backward()
        opt.step()
    opt.flush()
    state = opt.state_dict()
    opt.session.close()
    return [p.detach().clone() for p in model.parameters()], state


@pytest.fixture
def applied(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Small pieces, and what each piecewise application returned."""
    monkeypatch.setattr(plan_pieces, "PIECE_BYTES", 8 << 10)
    calls: list[bool] = []
    original = piecewise.PiecewiseUpdate.apply

    def spy(self: piecewise.PiecewiseUpdate, *args: Any) -> bool:
        calls.append(original(self, *args))
        return calls[-1]
    monkeypatch.setattr(piecewise.PiecewiseUpdate, "apply", spy)
    return calls


def _same(a: tuple[list[torch.Tensor], dict[str, Any]],
          b: tuple[list[torch.Tensor], dict[str, Any]]) -> None:
    for x, y in zip(a[0], b[0], strict=True):
        assert torch.equal(x, y)
    assert a[1]["state"].keys() == b[1]["state"].keys()
    for index, entry in a[1]["state"].items():
        for key, value in entry.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(b[1]["state"][index][key]))


@pytest.mark.parametrize(("opt_cls", "hyper"), [
    (torch.optim.SGD, {"momentum": 0.9, "weight_decay": 0.01}),
    (torch.optim.SGD, {"momentum": 0.9, "nesterov": True}),
    (torch.optim.Adam, {}),
    (torch.optim.AdamW, {"amsgrad": True})], ids=["sgd", "nesterov", "adam", "adamw-amsgrad"])
def test_piecewise_updates_match_the_synchronous_run(applied: list[bool], opt_cls: type,
                                                     hyper: dict[str, Any]) -> None:
    ours = _train("bytescheduler", opt_cls, **hyper)
    assert applied and all(applied), applied  # every application after the profiling steps
    _same(ours, _train("horovod", opt_cls, **hyper))


def test_a_group_without_state_is_stepped_whole(applied: list[bool]) -> None:
    """Plain SGD keeps no state: nothing to slice, the group's one call stays."""
    ours = _train("bytescheduler", torch.optim.SGD)
    assert applied and not any(applied)
    _same(ours, _train("horovod", torch.optim.SGD))


def test_a_loaded_state_is_sliced_again(applied: list[bool]) -> None:
    ours = _train("bytescheduler", torch.optim.Adam, reload_at=5)
    assert applied and all(applied)
    _same(ours, _train("horovod", torch.optim.Adam, reload_at=5))
