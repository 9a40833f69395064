"""The backend of a world and the GPU chosen before an NCCL group (world/devices.py): pure
choices, tested without processes or GPUs."""

from __future__ import annotations

import pytest

from commsched.config import ConfigError, load_config
from commsched.world.devices import Backend, choose_backend, device_for


@pytest.mark.parametrize(("requested", "cuda", "nccl", "expected"), [
    ("auto", True, True, Backend.NCCL),
    ("auto", True, False, Backend.GLOO),
    ("auto", False, True, Backend.GLOO),
    ("gloo", True, True, Backend.GLOO),
    ("nccl", True, True, Backend.NCCL),
])
def test_backend_follows_the_knob_and_what_the_host_has(requested: str, cuda: bool, nccl: bool,
                                                        expected: Backend) -> None:
    assert choose_backend(requested, cuda, nccl) is expected


@pytest.mark.parametrize(("cuda", "nccl", "why"), [
    (False, True, "no CUDA device is visible"),
    (True, False, "built without NCCL"),
])
def test_nccl_asked_for_where_it_cannot_run_names_the_variable(cuda: bool, nccl: bool,
                                                               why: str) -> None:
    with pytest.raises(ConfigError, match="COMMSCHED_BACKEND=nccl") as caught:
        choose_backend("nccl", cuda, nccl)
    assert why in str(caught.value) and "COMMSCHED_BACKEND=gloo" in str(caught.value)


def test_backend_knob_refuses_an_unknown_backend() -> None:
    assert load_config(environ={}).backend == "auto"
    assert load_config(environ={"COMMSCHED_BACKEND": "GLOO"}).backend == "gloo"
    with pytest.raises(ConfigError, match="COMMSCHED_BACKEND='mpi' is invalid.*auto, nccl, gloo"):
        load_config(environ={"COMMSCHED_BACKEND": "mpi"})


@pytest.mark.parametrize(("local_rank", "count", "initialised", "expected"), [
    (0, 8, False, 0),
    (5, 8, False, 5),
    (3, 1, False, 0),    # one visible GPU per process (CUDA_VISIBLE_DEVICES, --gpus-per-task)
    (9, 8, False, 1),    # more ranks than GPUs on the host: they share
    (5, 8, True, None),  # the script touched CUDA already: its device stays
    (0, 0, False, None),
])
def test_device_is_the_local_rank_unless_the_script_chose(local_rank: int, count: int,
                                                          initialised: bool,
                                                          expected: int | None) -> None:
    assert device_for(local_rank, count, initialised) == expected
