"""TCP ports for the local servers (:mod:`delayq.local`): free now, and hard to take meanwhile."""

from __future__ import annotations

import random
import socket
from pathlib import Path

__all__ = ["free_port", "port_free"]

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PORT = 10_000
""":func:`free_port` picks from here up to the kernel's ephemeral range."""
_PICK = random.SystemRandom()  # not the random module's state, which tests may seed
_GIVEN: set[int] = set()
"""Ports this process handed out: never again. Free when picked is not reserved: the
four ports of each of a cluster's three nodes, picked one after another before any node
binds, once drew the same port twice (a node then failed with ``eaddrinuse``)."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, below the kernel's ephemeral range where it can.

    A port of that range, free when picked, can be taken before the server binds it as
    the local port of any outgoing connection on the machine (seen in CI: a node's
    distribution port, the node then exits at once); a port below it is taken only by a
    bind. Where the range cannot be read or leaves no room, the kernel picks one. A port
    is handed out once per process.
    """
    low = _ephemeral_low()
    if low is not None and low - LOWEST_PORT >= 1_000:
        for _ in range(100):
            port = _PICK.randrange(LOWEST_PORT, low)
            if port not in _GIVEN and port_free(port):
                _GIVEN.add(port)
                return port
    for _ in range(100):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port
    raise OSError("no free TCP port on 127.0.0.1 that this process has not handed out")


def _ephemeral_low() -> int | None:
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def port_free(port: int) -> bool:
    """Whether a socket can bind ``port`` on 127.0.0.1 now."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
