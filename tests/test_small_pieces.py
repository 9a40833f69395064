"""Consistency helpers, compression, ops and the timeline writer."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest
import torch

from commsched import Compression, ReduceOp
from commsched.compression import resolve
from commsched.ops import resolve_op
from commsched.runtime.engine.timeline import TimelineWriter, timeline_path
from commsched.world.consistency import check_identical, digest, first_difference
from commsched.world.errors import MismatchError
from commsched.world.view import Launcher, World


def test_first_difference() -> None:
    assert first_difference([1, 2, 3], [1, 5, 3]) == (1, 2, 5)
    assert first_difference([1, 2], [1, 2, 3]) == (2, "<nothing>", 3)
    assert first_difference([1, 2, 3], [1, 2]) == (2, 3, "<nothing>")
    assert digest([["a", [1]]]) != digest([["a", [2]]])
    # Equal content digests equally (every rank computes it on its own), key order aside.
    assert digest([["a", [1]]]) == digest([["a", [1]]])
    assert digest({"b": 1, "a": [2]}) == digest({"a": [2], "b": 1})


class GatheringWorld(World):
    """A world whose all-gather returns what each rank is given to hold (`per_rank(items)`),
    counting the calls: check_identical's logic without processes."""

    def __init__(self, size: int, others: list[Any] | None = None) -> None:
        super().__init__(0, size, 0, Launcher.LONE if size == 1 else Launcher.TORCHRUN, None,
                         None, False, 1.0)
        self.others = others or []  # what ranks 1.. check: items, not digests
        self.gathers = 0

    def all_gather_object(self, obj: Any) -> list[Any]:
        self.gathers += 1
        if isinstance(obj, str):  # the digests round
            return [obj] + [digest(items) for items in self.others]
        return [obj, *self.others]


def test_check_identical_single_rank_is_trivial() -> None:
    world = GatheringWorld(1)
    check_identical(world, "x", [1])  # returns without raising
    assert world.gathers == 0  # a world of one never communicates


def test_check_identical_compares_digests_then_names_the_first_difference() -> None:
    same = GatheringWorld(3, others=[["horovod", "abc"], ["horovod", "abc"]])
    check_identical(same, "plan fingerprints", ["horovod", "abc"])
    assert same.gathers == 1  # equal digests: the full items are never gathered
    differ = GatheringWorld(3, others=[["horovod", "abc"], ["horovod", "xyz"]])
    with pytest.raises(MismatchError) as caught:
        check_identical(differ, "plan fingerprints", ["horovod", "abc"])
    assert str(caught.value) == ("commsched: plan fingerprints differ across ranks: first "
                                 "difference at entry 1: rank 0 has 'abc', rank 2 has 'xyz'")
    assert differ.gathers == 2


def test_compression_wire_dtypes() -> None:
    assert Compression.none.wire_dtype(torch.float32) is torch.float32
    assert Compression.fp16.wire_dtype(torch.float32) is torch.float16
    assert Compression.bf16.wire_dtype(torch.float64) is torch.bfloat16
    assert Compression.fp16.wire_dtype(torch.int64) is torch.int64
    original = torch.tensor([1.0, -2.5, 0.125])
    tensor, ctx = Compression.fp16.compress(original)
    assert tensor.dtype is torch.float16 and ctx is torch.float32
    restored = Compression.fp16.decompress(tensor, ctx)
    assert restored.dtype is torch.float32 and restored.equal(original)  # exact in fp16
    tensor, ctx = Compression.none.compress(original)
    assert tensor.dtype is torch.float32 and tensor.equal(original)


def test_horovod_compression_and_ops_are_accepted() -> None:
    import horovod.torch as hvd

    assert resolve(hvd.Compression.fp16) is Compression.fp16
    assert resolve(hvd.Compression.none) is Compression.none
    assert resolve_op(hvd.Average) is ReduceOp.AVERAGE and resolve_op(hvd.Sum) is ReduceOp.SUM
    with pytest.raises(ValueError, match="Adasum is not supported"):
        resolve_op(hvd.Adasum)
    with pytest.raises(ValueError, match="compression"):
        resolve(object())


def test_timeline_paths_and_events(tmp_path: pathlib.Path) -> None:
    assert timeline_path("a/t.json", 3) == "a/t.rank3.json"
    assert timeline_path("t", 2) == "t.rank2.json"
    assert timeline_path("t-{rank}.trace", 1) == "t-1.trace"
    writer = TimelineWriter(str(tmp_path / "t.json"), 0)
    writer.engine_events([("pack", "X", 10, 5, 1, 7, 64, "allreduce", "device_event"),
                          ("ready:w", "i", 9, 0, 0, -1, 0, "", "cpu")])
    writer.mark("iteration 1")
    writer.close()
    writer.mark("after close")  # dropped: the file is complete
    events = json.loads((tmp_path / "t.rank0.json").read_text())
    names = [e["name"] for e in events]
    assert names == ["process_name"] + ["thread_name"] * 4 + ["pack", "ready:w", "iteration 1"]
    pack, ready, mark = events[5:]
    assert pack["args"] == {"block": 7, "bytes": 64, "op": "allreduce", "clock": "device_event"}
    assert pack["dur"] == 5 and ready["args"] == {"clock": "cpu"} == mark["args"]
    assert (pack["ph"], pack["tid"], ready["ph"], ready["tid"], ready["s"]) == ("X", 1, "i", 0, "t")
    assert ready["ts"] - pack["ts"] == 9 - 10  # engine times are shifted by one common origin
    assert mark["ph"] == "i" and mark["s"] == "p" and mark["ts"] >= 0
