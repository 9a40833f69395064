"""The plan's crossing into commsched._C: typed structs with named fields, and the Collective
codes checked at import."""

from __future__ import annotations

import pytest
import torch

from commsched import _C
from commsched.compression import Compression
from commsched.plan import Block, Collective, Piece, Plan, Stage, TensorSpec
from commsched.runtime.engine import handle as engine_module


def _spec(**overrides: object) -> _C.BlockSpec:
    fields: dict = {"block_id": 7, "op": int(Collective.REDUCE_SCATTER), "wire_dtype": "bfloat16",
                    "prescale": 0.5, "postscale": 0.25, "released_by_caller": True, "source": 3,
                    "pieces": [_C.PieceSpec(tensor_id=2, offset=4, numel=5)]}
    fields.update(overrides)
    return _C.BlockSpec(**fields)


def test_block_spec_keeps_every_named_field() -> None:
    block = _spec()
    assert (block.block_id, block.op, block.wire_dtype, block.prescale, block.postscale,
            block.released_by_caller, block.source) == (7, 1, "bfloat16", 0.5, 0.25, True, 3)
    assert [(p.tensor_id, p.offset, p.numel) for p in block.pieces] == [(2, 4, 5)]


def test_block_spec_takes_no_positional_tuple() -> None:
    with pytest.raises(TypeError):
        _C.BlockSpec(0, 0, "float32", 1.0, 1.0, [], False, -1)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        _C.PieceSpec(0, 0, 4)  # type: ignore[call-arg]


@pytest.mark.parametrize("bad", [{"op": 3}, {"op": -1}, {"wire_dtype": "complex64"},
                                 {"pieces": [_C.PieceSpec(tensor_id=0, offset=-1, numel=2)]}])
def test_block_spec_refuses_what_the_engine_cannot_run(bad: dict) -> None:
    with pytest.raises(RuntimeError, match="commsched: "):
        _spec(**bad)


def test_the_codes_of_both_sides_agree_and_a_mismatch_is_named(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert _C.collective_codes() == {c.name.lower(): int(c) for c in Collective}
    engine_module.check_collective_codes()  # what importing commsched ran
    monkeypatch.setattr(engine_module._C, "collective_codes",
                        lambda: {"allreduce": 0, "reduce_scatter": 2, "all_gather": 1})
    with pytest.raises(ImportError, match="rebuild the extension"):
        engine_module.check_collective_codes()


def test_engine_handle_installs_a_plan_as_structs() -> None:
    import commsched

    world = commsched.init()
    specs = [TensorSpec(0, "w", 6, "float32", 4, 0), TensorSpec(1, "b", 2, "float32", 4, 1)]
    handle = engine_module.EngineHandle(world, specs, timeout=5.0)
    try:
        plan = Plan("test", (
            Block(0, (Piece(1, 0, 2), Piece(0, 3, 3)), "float32"),
            Block(1, (Piece(0, 0, 3),), "float32", Collective.ALLREDUCE, Stage.BACKWARD)))
        handle.install(plan, Compression.none, 1.0, 1.0)
        w, b = torch.arange(6.0), torch.ones(2)
        handle.mark_ready(0, w)
        handle.mark_ready(1, b)
        handle.wait()  # a world of one: the "reduction" leaves every value as it was
        assert torch.equal(w, torch.arange(6.0)) and torch.equal(b, torch.ones(2))
        assert handle.plan is plan and handle.rounds == 1
        # A world of one packs nothing, not even the two-piece block (Note [A world of one]).
        assert handle._engine.packed_bytes == 0
    finally:
        handle.shutdown()
