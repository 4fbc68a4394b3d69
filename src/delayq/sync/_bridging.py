"""The bridges of one process stopping together (``delayq bridge``, a worker's): each
waited for up to its grace and margin, fewer after a second stop request."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from delayq.errors import BrokerError
from delayq.intake.bridging import (
    HURRY_MARGIN_S,
    IO_JOIN_S,
    STOP_MARGIN_S,
    check_stop_grace,
)

if TYPE_CHECKING:
    from delayq.sync.bridge import Bridge

__all__ = ["HURRY_MARGIN_S", "IO_JOIN_S", "STOP_MARGIN_S", "check_stop_grace", "join_bridges"]

log = logging.getLogger("delayq.bridge")


def join_bridges(
    bridges: list[Bridge],
    threads: list[threading.Thread],
    failed: Callable[[str, BaseException], None],
    hurry: threading.Event,
) -> None:
    """Wait for the stopping bridges, each up to its stop grace and
    :data:`~delayq.intake.bridging.STOP_MARGIN_S` (from now), or :data:`HURRY_MARGIN_S`
    from a second stop request (``hurry``); one still running then is left behind (a
    daemon thread: closing a connection to a broker that does not answer), a failure of
    the run."""
    if not bridges:
        return
    until = time.monotonic() + max(b.stop_grace_s for b in bridges) + STOP_MARGIN_S
    hurried = False
    for bridge, thread in zip(bridges, threads, strict=True):
        while thread.is_alive() and time.monotonic() < until:
            thread.join(min(0.1, max(0.0, until - time.monotonic())))
            if hurry.is_set() and not hurried:
                hurried = True
                until = min(until, time.monotonic() + HURRY_MARGIN_S)
        if thread.is_alive():
            bound_s = HURRY_MARGIN_S if hurried else bridge.stop_grace_s + STOP_MARGIN_S
            log.error("bridge of %s did not stop within %g s; left behind", bridge.queue, bound_s)
            failed(
                bridge.queue,
                BrokerError(
                    f"the bridge of {bridge.queue} did not stop within {bound_s:g} s of the "
                    f"{'second ' if hurried else ''}stop (its stream stuck: a broker not "
                    "reading, a write that does not return); it was left behind, and its "
                    f"unacked deliveries go back to {bridge.queue} when its connection closes "
                    "(the process exits)"
                ),
            )
