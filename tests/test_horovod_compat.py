"""Horovod 0.28.1's own DistributedOptimizer tests (horovod_torch_tests.py) with commsched's
optimizer, broadcast_parameters, broadcast_optimizer_state and broadcast_object, on 2 Gloo ranks
under horovodrun: one job runs them all, and each case here reads its outcome on both ranks.
The three that need GPUs or MPI are skipped by Horovod's own conditions there; each case checks
that it was (docs/horovod_compat.md lists why)."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from launch import JOBS, horovodrun

pytestmark = pytest.mark.launcher

RANKS = 2

PASSING = [
    "test_broadcast_state", "test_broadcast_state_options", "test_broadcast_state_no_grad",
    "test_broadcast_object", "test_compression_fp16", "test_force_allreduce",
    "test_duplicate_names", "test_dynamic_requires_grad", "test_gradient_clipping",
    "test_synchronize_step_warning", "test_no_named_parameters", "test_missing_named_parameters",
    "test_optimizer_no_named_parameters", "test_sparse_embeddings", "test_optimizer_process_sets",
]
NOT_APPLICABLE = {
    "test_broadcast_state_gpu": "needs GPUs (and Horovod marks it @unittest.skip)",
    "test_model_parallelism": "needs two GPUs per rank",
    "test_delta_optimizer": "Adasum: needs MPI and GPUs",
}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = str(tmp_path_factory.mktemp("horovod_compat") / "outcomes")
    result = horovodrun(RANKS, os.path.join(JOBS, "run_horovod_tests.py"), out, timeout=300,
                        expect_ok=False)
    ranks = []
    for rank in range(RANKS):
        path = f"{out}.rank{rank}.json"
        if not os.path.exists(path):
            raise AssertionError(f"rank {rank} wrote no outcomes (horovodrun exited "
                                 f"{result.returncode})\n{result.stdout[-6000:]}")
        with open(path, encoding="utf-8") as handle:
            document = json.load(handle)
        if "<collection>" in document["tests"]:
            raise AssertionError(f"rank {rank} could not collect the tests: "
                                 f"{document['tests']['<collection>']['text']}")
        ranks.append(document["tests"])
    return ranks


@pytest.mark.parametrize("name", PASSING)
def test_horovod_test_passes(name: str, outcomes: list[dict[str, Any]]) -> None:
    for rank, tests in enumerate(outcomes):
        assert name in tests, f"rank {rank} did not run {name}"
        assert tests[name]["outcome"] == "passed", f"rank {rank}: {tests[name]['text']}"


@pytest.mark.parametrize("name", sorted(NOT_APPLICABLE))
def test_horovod_test_not_applicable_here(name: str, outcomes: list[dict[str, Any]]) -> None:
    for rank, tests in enumerate(outcomes):
        assert tests[name]["outcome"] == "skipped", \
            f"rank {rank}: {name} ({NOT_APPLICABLE[name]}) was not skipped: {tests[name]}"


def test_every_test_of_the_file_is_accounted_for(outcomes: list[dict[str, Any]]) -> None:
    assert sorted(outcomes[0]) == sorted([*PASSING, *NOT_APPLICABLE])


def test_the_optimizers_these_tests_drop_release_their_threads(
        outcomes: list[dict[str, Any]]) -> None:
    # The looping tests wrap about 90 optimizers; each kept an engine and a group (10 threads)
    # until shutdown, and a rank reached about 430 threads. A few threads of slack: Horovod's
    # own threads come and go with its init()/shutdown() around every test.
    for rank, tests in enumerate(outcomes):
        counts = {name: entry["threads_after"] for name, entry in tests.items()}
        first = min(counts.values())
        assert max(counts.values()) <= first + 4, f"rank {rank}: threads after each test {counts}"
