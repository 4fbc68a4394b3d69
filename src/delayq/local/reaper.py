"""Local servers end with the process that started them, however that process ends.

Every server :mod:`delayq.local` starts (a RabbitMQ node, its epmd, Redis, PostgreSQL,
Spark) runs in a process session of its own, so that a Ctrl-C at a terminal reaches
delayq first and delayq stops the server in order. The cost was that a process killed
outright (SIGKILL, a CI stage past its limit, an OOM kill) left its servers running: a
test run stopped half-way once left 8 RabbitMQ nodes and 2 Redis servers up for hours.

So one small watcher process per Python process holds the read end of a pipe, and each
server's session is registered with it (:func:`watch`) until it is stopped
(:func:`unwatch`). When the Python process ends, whatever way, the kernel closes the
pipe: the watcher sends SIGTERM to every process of each session still registered
(a RabbitMQ node then stops as ``rabbitmqctl stop`` would), and SIGKILL to what is left
after :data:`GRACE_S`.

A session id is a process id, and process ids are reused: the watcher only signals a
session whose leader is gone (its members keep the id from being reused) or is the very
process registered (the same start time in ``/proc``), never another that took its id.
A child made by ``fork`` without ``exec`` starts without the watcher (its own servers get
their own), so the pipe closes when this process ends, not when its last child does.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

__all__ = ["GRACE_S", "unwatch", "watch", "watched"]

GRACE_S = 10.0
"""How long the watcher waits after SIGTERM before it kills what is left."""

# Run by the watcher (python -c): read "+SID START" / "-SID" lines until the pipe closes.
_WATCHER = r"""
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
grace = float(sys.argv[1])
sessions = {}
for line in sys.stdin:
    fields = line.split()
    if len(fields) == 2 and fields[0] == "+":
        sessions[int(fields[1].split(":")[0])] = fields[1].split(":")[1]
    elif len(fields) == 2 and fields[0] == "-":
        sessions.pop(int(fields[1]), None)

def stat(pid):
    try:
        text = open(f"/proc/{pid}/stat").read()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()

def members(sid, start):
    leader = stat(sid)
    if leader is not None and leader[19] != start:
        return []  # the id was reused by another process: not ours
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = stat(int(entry))
            if fields is not None and int(fields[3]) == sid:
                found.append(int(entry))
    return found

def signal_all(sig):
    left = 0
    for sid, start in sessions.items():
        for pid in members(sid, start):
            left += 1
            try:
                os.kill(pid, sig)
            except OSError:
                pass
    return left

if signal_all(signal.SIGTERM):
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(members(s, t) for s, t in sessions.items()):
        time.sleep(0.2)
    signal_all(signal.SIGKILL)
"""

_lock = threading.Lock()
_pipe: IO[str] | None = None
_watcher: subprocess.Popen[str] | None = None
_sessions: dict[int, str] = {}


def _start_time(pid: int) -> str | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()[19]


def _send(line: str) -> None:
    """Write ``line`` to the watcher, starting one (and telling it every session still
    registered) when there is none or the last one is gone."""
    global _pipe, _watcher
    for _ in range(2):
        if _pipe is None or _watcher is None or _watcher.poll() is not None:
            _watcher = subprocess.Popen(
                [sys.executable, "-c", _WATCHER, str(GRACE_S)],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                text=True,
                start_new_session=True,  # a Ctrl-C at the terminal is not for it
            )
            _pipe = _watcher.stdin
            assert _pipe is not None
            # a new watcher: what it must know is every session registered now
            line = "".join(f"+ {sid}:{start}\n" for sid, start in _sessions.items())
        try:
            _pipe.write(line)
            _pipe.flush()
            return
        except (BrokenPipeError, OSError):
            _pipe = None


def watch(session: int) -> None:
    """End the processes of ``session`` (a server started with ``start_new_session``,
    whose pid is the session's id) when this process ends, unless :func:`unwatch` is
    called first. Quietly nothing where ``/proc`` cannot be read."""
    start = _start_time(session)
    if start is None:
        return
    with _lock:
        _sessions[session] = start
        _send(f"+ {session}:{start}\n")


def unwatch(session: int) -> None:
    """``session`` was stopped by its owner: nothing to do for it at exit."""
    with _lock:
        if _sessions.pop(session, None) is not None and _pipe is not None:
            _send(f"- {session}\n")


def watched() -> set[int]:
    """The sessions the watcher ends when this process ends."""
    with _lock:
        return set(_sessions)


def _forget_after_fork() -> None:
    """A forked child does not inherit the parent's sessions, and its copy of the pipe
    is closed (when the dropped file object is collected)."""
    global _pipe, _watcher, _lock
    _pipe, _watcher = None, None
    _sessions.clear()
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)
