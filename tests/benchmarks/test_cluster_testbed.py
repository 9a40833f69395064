"""The cluster testbed end to end (benchmarks/harness/testbed.py): 2 hosts as network
namespaces with a shaped link each, 2 ranks per host, launched as a multi-node torchrun (one
agent per host, c10d rendezvous on host 0); a replayed profile trained under commsched's policies
ends where torch DDP's does (benchmarks/harness/cluster_parity.py), and the namespaces are gone
afterwards. Needs root and iproute2, as the testbed does."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from launch import REPO, run_job

from benchmarks.harness.testbed import ClusterError, ClusterPlan, LinkShape, cluster
from commsched.bench.profile_model import ComputeProfile, ModuleCost

pytestmark = pytest.mark.launcher

PREFIX = f"cst{os.getpid() % 10_000}"


def _namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                          check=True).stdout


@pytest.fixture(autouse=True)
def _root() -> None:
    if os.geteuid() != 0:
        pytest.skip("the testbed makes network namespaces: run as root")


def test_two_hosts_of_two_ranks_train_as_ddp_does(tmp_path) -> None:
    # 6 modules of a few milliseconds each, parameters of 4-40 thousand elements.
    profile = ComputeProfile("toy", "stated for the test", 2, [
        ModuleCost(f"m{i}", [(f"m{i}.weight", [40, 100 * (i + 1)]), (f"m{i}.bias", [40])],
                   0.002, 0.004) for i in range(6)], update_s=0.002)
    path = tmp_path / "toy.json"
    path.write_text(json.dumps(profile.to_json()))
    out = tmp_path / "out"
    result = run_job([sys.executable, "-m", "benchmarks.harness.testbed", "run", "--hosts", "2",
                      "--ranks-per-host", "2", "--rate", "1gbit",
                      "--prefix", PREFIX, "--timeout", "240", "--out", str(out), "--",
                      os.path.join(REPO, "benchmarks", "harness", "cluster_parity.py"),
                      "--model", f"profile:{path}?k=2", "--policies", "horovod,dear,bytescheduler",
                      "--steps", "12", "--out", str(out)], timeout=300)
    parity = json.loads((out / "parity.json").read_text())
    assert parity["world_size"] == 4
    assert [(r["policy"], r["ok"]) for r in parity["rows"]] == [
        ("horovod", True), ("dear", True), ("bytescheduler", True)], parity
    testbed = json.loads((out / "testbed.json").read_text())
    assert testbed["plan"]["hosts"] == 2 and 0 < testbed["cpu_busy"] <= 1
    # Gradients crossed each host's link, and its own ranks talked over its loopback.
    assert all(b > 100_000 for b in testbed["link_bytes"] + testbed["local_bytes"]), testbed
    assert "link 1gbit" in result.stdout
    assert PREFIX not in _namespaces()


def test_a_testbed_whose_namespace_exists_is_refused_and_left_alone() -> None:
    plan = ClusterPlan(1, 1, LinkShape(), prefix=PREFIX + "x")
    subprocess.run(["ip", "netns", "add", plan.switch], check=True)
    try:
        with pytest.raises(ClusterError, match=f"{plan.switch} exist already"), cluster(plan):
            pass
        assert plan.switch in _namespaces()
    finally:
        subprocess.run(["ip", "netns", "delete", plan.switch], check=True)
