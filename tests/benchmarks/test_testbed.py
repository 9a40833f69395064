"""The cluster testbed's plan (benchmarks/harness/testbed.py): the namespaces, links and shaping
it builds, the agents it launches, and its refusals."""

from __future__ import annotations

import pytest

from benchmarks.harness.testbed import ClusterPlan, LinkShape, bucket, rate_bits


def test_rates_and_buckets() -> None:
    assert rate_bits("10gbit") == 10e9
    assert rate_bits("2.5mbit") == 2.5e6
    with pytest.raises(ValueError, match="10gbit"):
        rate_bits("10G")
    # A millisecond of traffic, and never less than two packets.
    assert bucket("10gbit", 9000) == "1250000b"
    assert bucket("100mbit", 9000) == "18000b"


def test_a_link_is_netem_over_a_token_bucket() -> None:
    assert LinkShape().commands("ns", "eth0", 9000) == []
    assert LinkShape("1gbit").commands("ns", "eth0", 9000) == [
        ["ip", "netns", "exec", "ns", "tc", "qdisc", "add", "dev", "eth0", "root", "handle",
         "10:", "tbf", "rate", "1gbit", "burst", "125000b", "latency", "100ms"]]
    shaped = LinkShape("1gbit", delay="50us", loss="1%").commands("ns", "eth0", 9000)
    assert shaped[0][9:] == ["root", "handle", "1:", "netem", "delay", "50us", "loss", "1%",
                             "limit", "100000"]
    assert shaped[1][9:12] == ["parent", "1:1", "handle"]


def test_the_plan_shapes_both_ends_of_every_host_link() -> None:
    plan = ClusterPlan(3, 4, LinkShape("1gbit", "100us"), LinkShape("100gbit"), prefix="t")
    assert plan.namespaces == ["t-sw", "t-h0", "t-h1", "t-h2"]
    assert plan.world_size == 12
    commands = plan.setup()
    assert commands[0] == ["ip", "netns", "add", "t-sw"]
    shaped = [(c[3], c[8]) for c in commands if c[4:6] == ["tc", "qdisc"] and "root" in c]
    # Each host's own end and the bridge's port facing it, and the host's loopback.
    assert shaped == [(ns, dev) for h in range(3)
                      for ns, dev in ((f"t-h{h}", "eth0"), ("t-sw", f"p{h}"), (f"t-h{h}", "lo"))]
    addresses = [c[5] for c in commands if c[3:5] == ["addr", "add"]]
    assert addresses == ["10.213.0.1/24", "10.213.0.2/24", "10.213.0.3/24"]
    assert plan.teardown() == [["ip", "netns", "delete", ns]
                               for ns in ["t-h2", "t-h1", "t-h0", "t-sw"]]


def test_every_agent_meets_at_host_0_and_names_its_own_address() -> None:
    plan = ClusterPlan(2, 2, LinkShape("1gbit"), prefix="t")
    first = plan.agent(0, ["-m", "pkg.job", "--x"], "run")
    second = plan.agent(1, ["job.py"], "run")
    assert first[:4] == ["ip", "netns", "exec", "t-h0"]
    assert "--rdzv-endpoint=10.213.0.1:29400" in first and "--rdzv-endpoint=10.213.0.1:29400" \
        in second
    assert "--rdzv-conf=is_host=1" in first and "--rdzv-conf=is_host=0" in second
    assert "--local-addr=10.213.0.2" in second and "--nnodes=2" in second
    assert first[-3:] == ["--module", "pkg.job", "--x"] and second[-1] == "job.py"


def test_a_plan_outside_the_limits_is_refused() -> None:
    with pytest.raises(ValueError, match="hosts must be 1-250"):
        ClusterPlan(0, 1, LinkShape())
