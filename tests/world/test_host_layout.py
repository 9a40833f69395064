"""local_size(), cross_rank() and cross_size() from every rank's host and local rank, as
Horovod defines them (world/view.py, host_layout)."""

from __future__ import annotations

from commsched.world.view import HostLayout, host_layout


def test_one_host() -> None:
    placement = [("a", 0), ("a", 1), ("a", 2)]
    assert [host_layout(placement, r) for r in range(3)] == [HostLayout(3, 0, 1)] * 3


def test_two_hosts_of_two_ranks() -> None:
    placement = [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    assert [host_layout(placement, r) for r in range(4)] == [
        HostLayout(2, 0, 2), HostLayout(2, 0, 2), HostLayout(2, 1, 2), HostLayout(2, 1, 2)]


def test_uneven_hosts_count_the_ranks_of_each_local_rank() -> None:
    """Host b runs one rank: local rank 1 exists on host a only (Horovod's cross groups)."""
    placement = [("a", 0), ("a", 1), ("b", 0)]
    assert [host_layout(placement, r) for r in range(3)] == [
        HostLayout(2, 0, 2), HostLayout(2, 0, 1), HostLayout(1, 1, 2)]
