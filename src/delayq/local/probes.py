"""How delayq tells a local RabbitMQ node's state without ``rabbitmqctl``: whether it
answers AMQP clients, whether its boot logged its end, and its Erlang VM to stop.

``rabbitmqctl`` is an Erlang VM of its own each time it runs (0.7 to 1.1 s of CPU and up to
a second on a 2-core machine): a local node's start and stop used to run it twice.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

__all__ = [
    "AMQP_HEADER",
    "BOOT_LOGGED",
    "BOOT_LOG_WAIT_S",
    "amqp_answers",
    "epmd_answers",
    "stop_epmd",
    "terminate",
    "tidy_epmd",
    "vm_of",
]


BOOT_LOGGED = b"Server startup complete"
"""What RabbitMQ (3.10 and 4.x alike) logs at ``info`` once its boot steps and plugins ran."""

BOOT_LOG_WAIT_S = 5.0
"""How long a node that answers AMQP clients is given to log :data:`BOOT_LOGGED`."""

AMQP_HEADER = b"AMQP\x00\x00\x09\x01"
"""The protocol header an AMQP 0-9-1 client opens with."""


def amqp_answers(port: int, timeout_s: float = 2.0) -> bool:
    """Whether a broker on ``port`` answers an AMQP 0-9-1 client: it sends its
    ``connection.start`` (a method frame on channel 0) after the protocol header.

    RabbitMQ opens its AMQP listener late in its boot, so an answer means the node takes
    clients; ``LocalNode.start`` then reads the end of the boot from the node's log."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
            sock.sendall(AMQP_HEADER)
            head = b""
            while len(head) < 3:
                chunk = sock.recv(3 - len(head))
                if not chunk:
                    return False
                head += chunk
    except OSError:
        return False
    return head == b"\x01\x00\x00"  # frame type 1 (method), channel 0


def vm_of(session: int) -> int | None:
    """The pid of the Erlang VM (``beam.smp``) in the process session ``session`` (a
    server started with ``start_new_session``; a tree's server runs in a PID namespace
    of its own, whose processes the host sees with host pids)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        if name == "beam.smp" and int(fields[3]) == session:
            return int(entry)
    return None


def terminate(process: subprocess.Popen[bytes], timeout_s: float) -> bool:
    """SIGTERM to ``process``'s Erlang VM; whether the server then ended within
    ``timeout_s`` (``False`` too when it has no VM yet, so nothing to stop in order)."""
    vm = vm_of(process.pid)
    if vm is None:
        return False
    try:
        os.kill(vm, signal.SIGTERM)
        process.wait(timeout=timeout_s)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        return process.poll() is not None
    return True


def _epmd() -> str:
    return shutil.which("epmd") or "/usr/bin/epmd"


def epmd_answers() -> bool:
    """Whether an Erlang port mapper (epmd) answers on this host's default port."""
    try:
        return subprocess.run([_epmd(), "-names"], capture_output=True, timeout=5).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def stop_epmd() -> None:
    """Stop the default port's epmd, unless a node is still registered with it (``epmd
    -kill`` then refuses: "Killing not allowed - living nodes in database")."""
    try:
        subprocess.run([_epmd(), "-kill"], capture_output=True, timeout=5, check=False)
    except (OSError, subprocess.TimeoutExpired):
        pass


@contextlib.contextmanager
def tidy_epmd() -> Iterator[None]:
    """Around local nodes outside a test session (a bench's, say): a node on Erlang's
    default epmd port (the installed 3.10.8 server's) starts an epmd that outlives it,
    stopped at the end unless one answered before (a 4.0 node's epmd is its own)."""
    before = epmd_answers()
    try:
        yield
    finally:
        if not before:
            stop_epmd()
