"""Two "hosts": two network namespaces joined by a veth pair, each with its own address, one
torchrun node in each. The bootstrap must not assume loopback: Gloo binds to the address the host
name resolves to (127.0.x.1 here) unless commsched picks the interface on the route to the
rendezvous host, and then the peers dial their own loopback and time out."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading

import pytest
from launch import BIN, JOBS, run_job

pytestmark = pytest.mark.launcher

SUBNET = "10.77.{}.{}"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture
def two_hosts():
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 to create network namespaces")
    tag = os.getpid() % 200 + 20
    names = (f"cshostA{tag}", f"cshostB{tag}")
    links = (f"csva{tag}", f"csvb{tag}")
    addresses = (SUBNET.format(tag, 1), SUBNET.format(tag, 2))
    try:
        for ns in names:
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("link", "add", links[0], "type", "veth", "peer", "name", links[1])
        for ns, link, address in zip(names, links, addresses, strict=True):
            _ip("link", "set", link, "netns", ns)
            _ip("-n", ns, "addr", "add", f"{address}/24", "dev", link)
            _ip("-n", ns, "link", "set", link, "up")
        yield names, addresses
    finally:
        for ns in names:
            subprocess.run(["ip", "netns", "delete", ns], capture_output=True, timeout=30)


@pytest.mark.parametrize("rendezvous", ["static", "c10d"])
def test_two_namespace_hosts_train_like_one_host(two_hosts, rendezvous: str) -> None:
    """`static`: --master_addr and a node rank each; `c10d`: torchrun's c10d rendezvous on
    host 0, which assigns the node ranks and hands the workers MASTER_ADDR itself."""
    names, addresses = two_hosts
    results: dict[int, object] = {}

    def node(rank: int) -> None:
        meet = [f"--node_rank={rank}", f"--master_addr={addresses[0]}", "--master_port=29533"] \
            if rendezvous == "static" else \
            ["--rdzv_backend=c10d", f"--rdzv_endpoint={addresses[0]}:29534", "--rdzv_id=cs2",
             # Both namespaces share one host name, by which torchrun would find the store's
             # host and tell the workers where rank 0 is: say both instead.
             f"--rdzv_conf=is_host={int(rank == 0)}", f"--local_addr={addresses[rank]}"]
        args = ["ip", "netns", "exec", names[rank], os.path.join(BIN, "torchrun"), "--nnodes=2",
                "--nproc_per_node=1", *meet, os.path.join(JOBS, "torchrun_job.py")]
        try:
            results[rank] = run_job(args, timeout=240, expect_ok=False)
        except AssertionError as err:  # hung: report with the other node's outcome
            results[rank] = err

    threads = [threading.Thread(target=node, args=(r,)) for r in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for rank in range(2):
        result = results[rank]
        assert isinstance(result, subprocess.CompletedProcess), f"node {rank}: {result}"
        assert result.returncode == 0, \
            f"node {rank} exited {result.returncode}\n{result.stdout[-4000:]}"
        # torchrun_job checks every rank's parameters against one process training on the
        # concatenated batch: the one-host result.
        verdicts = re.findall(r"rank (\d) policy (\w+): max diff \S+ (OK|FAIL)", result.stdout)
        assert sorted(verdicts) == [(str(rank), p, "OK") for p in ("ddp", "horovod", "mgwfbp")], \
            result.stdout[-3000:]
