"""Consistency helpers, compression, ops and the timeline writer."""

from __future__ import annotations

import json

import pytest
import torch

from commsched import Compression, ReduceOp
from commsched.compression import resolve
from commsched.ops import resolve_op
from commsched.runtime.timeline import TimelineWriter, timeline_path
from commsched.world.consistency import check_identical, digest, first_difference


def test_first_difference() -> None:
    assert first_difference([1, 2, 3], [1, 5, 3]) == (1, 2, 5)
    assert first_difference([1, 2], [1, 2, 3]) == (2, "<nothing>", 3)
    assert digest([["a", [1]]]) != digest([["a", [2]]])


def test_check_identical_single_rank_is_trivial() -> None:
    from commsched.world.bootstrap import Launcher, World

    check_identical(World(0, 1, 0, Launcher.LONE, None, None, False, 1.0), "x", [1])


def test_compression_wire_dtypes() -> None:
    assert Compression.none.wire_dtype(torch.float32) is torch.float32
    assert Compression.fp16.wire_dtype(torch.float32) is torch.float16
    assert Compression.bf16.wire_dtype(torch.float64) is torch.bfloat16
    assert Compression.fp16.wire_dtype(torch.int64) is torch.int64
    tensor, ctx = Compression.fp16.compress(torch.ones(2))
    assert tensor.dtype is torch.float16 and Compression.fp16.decompress(tensor, ctx).dtype is torch.float32


def test_horovod_compression_and_ops_are_accepted() -> None:
    import horovod.torch as hvd

    assert resolve(hvd.Compression.fp16) is Compression.fp16
    assert resolve(hvd.Compression.none) is Compression.none
    assert resolve_op(hvd.Average) is ReduceOp.AVERAGE and resolve_op(hvd.Sum) is ReduceOp.SUM
    with pytest.raises(ValueError, match="Adasum is not supported"):
        resolve_op(hvd.Adasum)
    with pytest.raises(ValueError, match="compression"):
        resolve(object())


def test_timeline_paths_and_events(tmp_path) -> None:
    assert timeline_path("a/t.json", 3) == "a/t.rank3.json"
    assert timeline_path("t-{rank}.trace", 1) == "t-1.trace"
    writer = TimelineWriter(str(tmp_path / "t.json"), 0)
    writer.engine_events([("pack", "X", 10, 5, 1, 7, 64, "allreduce"), ("ready:w", "i", 9, 0, 0, -1, 0, "")])
    writer.mark("iteration 1")
    writer.close()
    events = json.loads((tmp_path / "t.rank0.json").read_text())
    pack = next(e for e in events if e["name"] == "pack")
    assert pack["args"] == {"block": 7, "bytes": 64, "op": "allreduce"} and pack["dur"] == 5
    assert any(e["name"] == "iteration 1" for e in events)
