"""Which network interface Gloo binds to: the one on the route to the rendezvous host."""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger("commsched")


def address_towards(host: str, port: int) -> str:
    """This host's address on the route to `host` (the rendezvous server).

    Peers that reach the server reach it too, without assuming loopback or an interface name.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((host, port))  # UDP: no packet is sent
        return str(probe.getsockname()[0])


def interface_with_address(address: str) -> str | None:
    """The name of the local interface that holds `address` (Linux: SIOCGIFADDR)."""
    import fcntl
    import struct

    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(probe.fileno(), siocgifaddr,
                                  struct.pack("256s", name[:15].encode()))
            except OSError:
                continue  # no IPv4 address on this interface
            if socket.inet_ntoa(raw[20:24]) == address:
                return name
    return None


def choose_gloo_interface(peer: str) -> None:
    """Sets GLOO_SOCKET_IFNAME to the interface on the route to the rendezvous host `peer`.

    Gloo binds to the address the host name resolves to, which is often 127.0.x.1: peers on
    other hosts then dial their own loopback and the job times out. An interface the user chose
    (GLOO_SOCKET_IFNAME) is kept. Under NCCL too: a world's control group is Gloo's.
    """
    if os.environ.get("GLOO_SOCKET_IFNAME"):
        return
    try:
        local = address_towards(peer, 9)
    except OSError:
        return  # cannot resolve or route: leave Gloo's own choice
    if local.startswith("127."):
        return
    interface = interface_with_address(local)
    if interface:
        os.environ["GLOO_SOCKET_IFNAME"] = interface
        log.info("commsched: Gloo uses interface %s (%s), the route to %s", interface, local, peer)
