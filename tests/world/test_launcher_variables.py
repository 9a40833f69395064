"""Reading the launcher's variables (world/launchers.py), and the errors of a process whose
variables say more than one process where no world can be formed: never a world of one."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from commsched.world.errors import LauncherError
from commsched.world.launchers import derived_port, first_host, read_launcher
from commsched.world.view import Launcher


def test_no_launcher_is_a_world_of_one() -> None:
    launched = read_launcher({"PATH": "/bin", "SLURM_NTASKS": "1", "WORLD_SIZE": "1"})
    assert (launched.launcher, launched.rank, launched.size) == (Launcher.LONE, 0, 1)


@pytest.mark.parametrize(("env", "expected"), [
    ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
      "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_MCA_ess_base_jobid": "77"},
     (Launcher.MPI, 3, 4, 1, False, "mpi-77")),
    ({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"},
     (Launcher.MPI, 1, 2, 1, True, "")),
    ({"MV2_COMM_WORLD_RANK": "0", "MV2_COMM_WORLD_SIZE": "8"},
     (Launcher.MPI, 0, 8, 0, None, "")),
    ({"SLURM_PROCID": "5", "SLURM_STEP_NUM_TASKS": "8", "SLURM_LOCALID": "1",
      "SLURM_STEP_NUM_NODES": "4", "SLURM_STEP_NODELIST": "gpu[003-006]", "SLURM_JOB_ID": "42",
      "SLURM_STEP_ID": "0", "SLURM_NTASKS": "8"},
     (Launcher.SLURM, 5, 8, 1, False, "slurm-42.0")),
])
def test_each_launcher_says_rank_size_and_host(env: dict[str, str], expected: tuple) -> None:
    launched = read_launcher(env)
    assert (launched.launcher, launched.rank, launched.size, launched.local_rank,
            launched.single_host, launched.job) == expected
    assert set(launched.seen) <= set(env)


def test_the_inner_launcher_wins() -> None:
    """torchrun in an srun step, mpirun in a batch script: the inner one started us."""
    slurm = {"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "2", "SLURM_NTASKS": "2"}
    torchrun = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "h"}
    assert read_launcher({**slurm, **torchrun}).launcher is Launcher.TORCHRUN
    mpi = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4"}
    assert read_launcher({"SLURM_NTASKS": "4", **mpi}).launcher is Launcher.MPI
    assert read_launcher({**mpi, "HOROVOD_RANK": "1", "HOROVOD_SIZE": "4"}).launcher \
        is Launcher.HOROVOD


@pytest.mark.parametrize(("env", "names"), [
    ({"OMPI_COMM_WORLD_SIZE": "2"}, ["OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE=2"]),
    ({"PMI_RANK": "2", "PMI_SIZE": "2"}, ["rank 2 is outside a world of 2", "PMI_RANK=2"]),
    ({"SLURM_STEP_NUM_TASKS": "two", "SLURM_PROCID": "0"}, ["SLURM_STEP_NUM_TASKS='two'"]),
    ({"WORLD_SIZE": "4"}, ["RANK is not set", "WORLD_SIZE=4"]),
    ({"SLURM_NTASKS": "4", "SLURM_PROCID": "0"}, ["SLURM_NTASKS=4", "srun python"]),
    ({"HOROVOD_RANK": "0"}, ["HOROVOD_SIZE is not set"]),
])
def test_incomplete_variables_are_named(env: dict[str, str], names: list[str]) -> None:
    with pytest.raises(LauncherError) as raised:
        read_launcher(env)
    for name in names:
        assert name in str(raised.value), str(raised.value)


@pytest.mark.parametrize(("nodelist", "host"), [
    ("node07", "node07"), ("node[07-09,12],gpu1", "node07"), ("gpu1,node[1-2]", "gpu1"),
    ("rack2-n[0003,0009]", "rack2-n0003"), ("a[5]b", "a5b"),
])
def test_first_host_of_a_slurm_node_list(nodelist: str, host: str) -> None:
    assert first_host(nodelist) == host


def test_unreadable_node_list_says_to_set_master_addr() -> None:
    with pytest.raises(LauncherError, match="MASTER_ADDR"):
        first_host("node[x-y]")


def test_derived_port_is_the_same_for_a_job_and_in_range() -> None:
    ports = {derived_port(f"commsched/slurm-{job}.0/") for job in range(200)}
    assert all(20000 <= p < 40000 for p in ports)
    assert len(ports) > 190  # jobs rarely share one
    assert derived_port("commsched/mpi-5/") == derived_port("commsched/mpi-5/")


def _init_in_a_process(env: dict[str, str]) -> subprocess.CompletedProcess:
    """commsched.init() in a fresh process with only `env` of the launcher's variables."""
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("OMPI_", "PMI", "SLURM_", "MV2_", "HOROVOD_", "MASTER_"))
             and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    code = ("import sys; sys.modules['horovod'] = None\n"  # as where Horovod is not installed
            "import commsched\n"
            "try:\n    commsched.init()\nexcept commsched.LauncherError as err:\n"
            "    print('LauncherError:', err); sys.exit(3)\nprint('formed a world')\n")
    return subprocess.run([sys.executable, "-c", code], env={**clean, **env}, text=True,
                          capture_output=True, timeout=120)


def test_a_lone_process_of_a_multi_host_mpi_job_fails_at_once() -> None:
    result = _init_in_a_process({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2",
                                 "OMPI_COMM_WORLD_LOCAL_RANK": "0",
                                 "OMPI_COMM_WORLD_LOCAL_SIZE": "1"})
    assert result.returncode == 3, result.stdout + result.stderr
    assert "spans several hosts" in result.stdout or "span several hosts" in result.stdout
    assert "MASTER_ADDR" in result.stdout and "OMPI_COMM_WORLD_SIZE=2" in result.stdout


def test_a_rank_whose_rank_0_never_comes_fails_after_the_timeout() -> None:
    """One host, rank 1 of 2, no rank 0: it waits COMMSCHED_TIMEOUT for rank 0's rendezvous
    file, then names it."""
    result = _init_in_a_process({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1",
                                 "MPI_LOCALNRANKS": "2", "COMMSCHED_TIMEOUT": "2"})
    assert result.returncode == 3, result.stdout + result.stderr
    assert "waited 2 s (COMMSCHED_TIMEOUT) for rank 0's rendezvous file" in result.stdout
    assert "PMI_RANK=1" in result.stdout
