"""commsched.checkpoint: atomic writes, and truncated or altered files refused by name."""

from __future__ import annotations

import os

import pytest
import torch

import commsched
from commsched.checkpoint import CheckpointError, load, save


def test_round_trip_and_no_file(tmp_path) -> None:
    path = str(tmp_path / "run.ckpt")
    assert load(path) is None
    state = {"w": torch.arange(6.0).view(2, 3), "step": 7, "nested": {"m": torch.ones(2)}}
    save(path, state, rank=0)
    back = load(path)
    assert back is not None and back["step"] == 7
    assert torch.equal(back["w"], torch.arange(6.0).view(2, 3))
    assert torch.equal(back["nested"]["m"], torch.ones(2))
    assert os.listdir(tmp_path) == ["run.ckpt"]  # no temporary file left
    assert commsched.checkpoint.save is save


def test_only_rank_0_writes(tmp_path) -> None:
    path = str(tmp_path / "run.ckpt")
    save(path, {"step": 1}, rank=1)
    assert not os.path.exists(path)


@pytest.mark.parametrize(("cut", "expected"), [(1, "is not a commsched checkpoint"),
                                               (100, "is truncated: 52 of its"),
                                               (-1, "is truncated")])
def test_a_truncated_file_is_refused(tmp_path, cut: int, expected: str) -> None:
    path = str(tmp_path / "run.ckpt")
    save(path, {"w": torch.randn(100)}, rank=0)
    with open(path, "rb") as handle:
        data = handle.read()
    with open(path, "wb") as handle:
        handle.write(data[:cut])
    with pytest.raises(CheckpointError, match=expected) as caught:
        load(path)
    assert path in str(caught.value)


def test_an_altered_file_is_refused(tmp_path) -> None:
    path = str(tmp_path / "run.ckpt")
    save(path, {"w": torch.zeros(100)}, rank=0)
    with open(path, "rb") as handle:
        data = bytearray(handle.read())
    data[-20] ^= 0xFF
    with open(path, "wb") as handle:
        handle.write(bytes(data))
    with pytest.raises(CheckpointError, match="damaged"):
        load(path)


def test_a_writer_killed_mid_write_leaves_the_previous_checkpoint(tmp_path, monkeypatch) -> None:
    path = str(tmp_path / "run.ckpt")
    save(path, {"step": 1}, rank=0)

    def dies(*args: object) -> None:  # the process is killed between the write and the rename
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", dies)
    with pytest.raises(KeyboardInterrupt):
        save(path, {"step": 2}, rank=0)
    monkeypatch.undo()
    back = load(path)
    assert back is not None and back["step"] == 1
    assert os.listdir(tmp_path) == ["run.ckpt"]
