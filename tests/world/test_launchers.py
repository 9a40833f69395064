"""Every launcher forms the job's world, or fails loudly (Note [Which launcher started this
process] in world/launchers.py, Note [Finding the rendezvous] in world/bootstrap.py).

Real launchers: Open MPI's mpirun (as root, with its flags for that), MPICH's Hydra, horovodrun
under its MPI controller (Horovod built with MPI and Gloo by scripts/install_horovod.sh), and
srun of a one-node Slurm cluster the tests start (slurm_cluster.py). Each 2-rank job trains
launcher_job.py and must end with the parameters of the same job under torchrun, to the bit.
Where the job's ranks span several hosts, a wrapper says so to the ranks (the launcher's local
size of 1, srun's two nodes): the rendezvous of several hosts then runs on this one.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from typing import Any

import pytest
import torch
from launch import BIN, JOBS, run_job
from slurm_cluster import missing_parts, slurm_cluster

pytestmark = pytest.mark.launcher

JOB = os.path.join(JOBS, "launcher_job.py")
PY = sys.executable
OPENMPI = shutil.which("mpirun.openmpi") or shutil.which("mpirun")
HYDRA = shutil.which("mpiexec.hydra")
ROOT_OK = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _openmpi(*command: str) -> list[str]:
    if OPENMPI is None:
        pytest.skip("Open MPI's mpirun is not installed (scripts/setup.sh installs it as root)")
    return [OPENMPI, "--allow-run-as-root", "--oversubscribe", "-np", "2", *command]


def _horovod_with_mpi() -> None:
    try:
        import horovod.torch as hvd
    except ImportError as err:
        pytest.skip(f"horovod is not importable ({err})")
    if not hvd.mpi_built():
        pytest.skip("Horovod was built without MPI (scripts/install_horovod.sh builds it with "
                    "MPI where mpicxx is found)")


def _results(out: str) -> dict[int, dict[str, Any]]:
    return {rank: torch.load(os.path.join(out, f"rank{rank}.pt")) for rank in (0, 1)}


def _job(tmp_path, name: str, args: list[str], env: dict[str, str] | None = None,
         expect_ok: bool = True) -> tuple[str, str]:
    out = str(tmp_path / name)
    os.makedirs(out)
    result = run_job([part.replace("{out}", out) for part in args], timeout=180,
                     env={**ROOT_OK, **(env or {})}, expect_ok=expect_ok)
    return out, result.stdout


@pytest.fixture(scope="module")
def torchrun_params(tmp_path_factory) -> dict[int, dict[str, Any]]:
    out = str(tmp_path_factory.mktemp("torchrun"))
    run_job([os.path.join(BIN, "torchrun"), "--standalone", "--nproc_per_node=2", JOB, out],
            timeout=180)
    results = _results(out)
    for rank in (0, 1):
        _check_calls(results[rank]["calls"])
    return results


def _check_calls(calls: dict[str, Any]) -> None:
    """launcher_job.calls() on 2 ranks of one host: [1 + rank, 10 rank] reduced, rank + 1 rows
    of the rank gathered, rank 1's value broadcast."""
    assert torch.equal(calls["average"], torch.tensor([1.5, 5.0])), calls
    assert torch.equal(calls["sum"], torch.tensor([3.0, 10.0])), calls
    assert torch.equal(calls["sum_flag"], calls["sum"]), calls
    assert torch.equal(calls["gathered"], torch.tensor([[0.0, 0.0], [1.0, 1.0], [1.0, 1.0]])), \
        calls
    assert torch.equal(calls["broadcast"], torch.tensor([1.0])), calls
    assert calls["layout"] == (2, 0, 1), calls  # local_size, cross_rank, cross_size


def _same_as_torchrun(out: str, reference: dict[int, dict[str, Any]], launcher: str) -> None:
    results = _results(out)
    for rank in (0, 1):
        got = results[rank]
        assert (got["rank"], got["size"], got["local_rank"]) == (rank, 2, rank), got
        assert got["launcher"] == launcher, (got["launcher"], launcher)
        _check_calls(got["calls"])
        for policy, params in got["params"].items():
            for p, q in zip(params, reference[rank]["params"][policy], strict=True):
                assert torch.equal(p, q), \
                    f"rank {rank}, {policy}: max diff {float((p - q).abs().max()):.3g}"


# (name, command, extra environment, the world's launcher)
def _mpi_cases() -> list[tuple[str, list[str], dict[str, str], str]]:
    several_hosts = ["sh", "-c", f'OMPI_COMM_WORLD_LOCAL_SIZE=1 exec "{PY}" "{JOB}" "$0" "$1"']
    return [
        ("mpirun", [PY, JOB, "{out}"], {}, "mpi"),
        ("mpirun, MASTER_ADDR", [PY, JOB, "{out}"], {"MASTER_ADDR": "127.0.0.1"}, "mpi"),
        ("mpirun, Horovod loaded", [PY, JOB, "{out}", "--horovod"], {}, "horovod"),
        ("mpirun, several hosts", [*several_hosts, "{out}", ""], {}, "horovod"),
        ("mpirun, own group", [PY, JOB, "{out}", "--own-group"], {}, "existing"),
    ]


@pytest.mark.parametrize("case", range(len(_mpi_cases())),
                         ids=[c[0] for c in _mpi_cases()])
def test_open_mpi_job_trains_as_torchrun(tmp_path, torchrun_params, case: int) -> None:
    name, command, env, launcher = _mpi_cases()[case]
    if launcher == "horovod":
        _horovod_with_mpi()
    env = {**env, "JOB_PORT": str(_free_port())}  # the own group's
    if "MASTER_ADDR" in env:
        env["MASTER_PORT"] = str(_free_port())
    out, _ = _job(tmp_path, "job", _openmpi(*command), env)
    _same_as_torchrun(out, torchrun_params, launcher)
    if "MASTER_ADDR" in env:  # the store is where the variables say
        assert _results(out)[1]["store_address"] == ("127.0.0.1", int(env["MASTER_PORT"]))


def test_mpich_hydra_job_trains_as_torchrun(tmp_path, torchrun_params) -> None:
    if HYDRA is None:
        pytest.skip("MPICH's mpiexec.hydra is not installed (scripts/setup.sh installs it)")
    out, _ = _job(tmp_path, "job", [HYDRA, "-n", "2", PY, JOB, "{out}"])
    _same_as_torchrun(out, torchrun_params, "mpi")


def test_horovodrun_mpi_controller_trains_as_torchrun(tmp_path, torchrun_params) -> None:
    """horovodrun without --gloo runs mpirun where Horovod has MPI: no HOROVOD_RANK is set."""
    _horovod_with_mpi()
    if OPENMPI is None:
        pytest.skip("Open MPI's mpirun is not installed")
    out, _ = _job(tmp_path, "job", [os.path.join(BIN, "horovodrun"), "-np", "2", PY, JOB,
                                    "{out}"])
    _same_as_torchrun(out, torchrun_params, "mpi")


def test_open_mpi_over_hosts_without_a_rendezvous_fails_naming_it(tmp_path) -> None:
    """Several hosts, no MASTER_ADDR, no Horovod: each rank fails at once, naming the
    launcher's variables and what to set, instead of training alone."""
    several_hosts = ["sh", "-c",
                     f'OMPI_COMM_WORLD_LOCAL_SIZE=1 exec "{PY}" "{JOB}" "$0" --no-horovod']
    out, output = _job(tmp_path, "job", _openmpi(*several_hosts, "{out}"), expect_ok=False)
    for rank in (0, 1):
        path = os.path.join(out, f"rank{rank}.error")
        assert os.path.exists(path), output[-3000:]
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
        assert f"rank {rank} of 2 of a Open MPI job" in text, text
        assert "OMPI_COMM_WORLD_SIZE=2" in text and "MASTER_ADDR" in text, text
        assert not os.path.exists(os.path.join(out, f"rank{rank}.pt"))


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    reason = missing_parts()
    if reason is not None:
        pytest.skip(f"no Slurm cluster here: {reason}")
    with slurm_cluster(str(tmp_path_factory.mktemp("slurm"))) as env:
        yield env


@pytest.mark.parametrize("nodes", ["one node", "several nodes"])
def test_srun_job_trains_as_torchrun(tmp_path, torchrun_params, slurm, nodes: str) -> None:
    command = [PY, JOB, "{out}"] if nodes == "one node" else \
        ["sh", "-c", f'SLURM_STEP_NUM_NODES=2 exec "{PY}" "{JOB}" "$0"', "{out}"]
    out, _ = _job(tmp_path, "job", ["srun", "-n", "2", *command], slurm)
    _same_as_torchrun(out, torchrun_params, "slurm")
    # One node: rank 0's loopback store, found through a file; several: the step's first node.
    host = _results(out)[1]["store_address"][0]
    assert host == ("127.0.0.1" if nodes == "one node" else socket.gethostname().split(".")[0])


def test_batch_script_without_srun_fails_naming_it(tmp_path, slurm) -> None:
    """sbatch -n 2 running the script once, not through srun: an error, not a world of one."""
    out = str(tmp_path / "job")
    os.makedirs(out)
    log = os.path.join(out, "batch.log")
    script = os.path.join(out, "batch.sh")
    with open(script, "w", encoding="utf-8") as handle:
        handle.write(f'#!/bin/sh\nexec "{PY}" "{JOB}" "{out}"\n')  # sbatch passes PYTHONPATH
    submitted = run_job(["sbatch", "--parsable", "-n", "2", "-o", log, script], timeout=60,
                        env=slurm)
    _wait_for_batch_job(submitted.stdout.strip().split(";")[0], slurm, timeout=180)
    with open(os.path.join(out, "rank0.error"), encoding="utf-8") as handle:
        text = handle.read()
    assert "SLURM_NTASKS=2" in text and "srun python" in text, text
    assert not os.path.exists(os.path.join(out, "rank0.pt"))


def _wait_for_batch_job(job_id: str, slurm: dict[str, str], timeout: float) -> None:
    """Until the batch job has ended. sbatch -W would wait as well, but it asks again only after
    sleeps that grow to several seconds: most of this test's time went there."""
    deadline = time.monotonic() + timeout
    while True:
        shown = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True,
                               text=True, env={**os.environ, **slurm}, timeout=30)
        state = shown.stdout + shown.stderr
        if "Invalid job id" in state:  # ended and already purged (MinJobAge)
            return
        ended = re.search(r"JobState=(\w+)", state)
        if ended is not None and ended.group(1) not in ("PENDING", "CONFIGURING", "RUNNING",
                                                        "COMPLETING"):
            return
        assert time.monotonic() < deadline, f"batch job {job_id} still running: {state}"
        time.sleep(0.2)
