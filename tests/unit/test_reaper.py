"""Local servers end with the process that started them, even one killed outright
(:mod:`delayq.local.reaper`): a test run killed half-way left its nodes running for hours."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")

# The owner: starts "servers" in sessions of their own, registers them, says their pids,
# then waits to be killed.
OWNER = textwrap.dedent(
    """
    import subprocess, sys, time
    from delayq.local import reaper
    reaper.GRACE_S = float(sys.argv[1])
    stubborn = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(300)"
    )
    servers = {
        "plain": [sys.executable, "-c", "import time; time.sleep(300)"],
        "stubborn": [sys.executable, "-c", stubborn],
        "stopped": [sys.executable, "-c", "import time; time.sleep(300)"],
    }
    pids = {}
    for name, argv in servers.items():
        process = subprocess.Popen(argv, start_new_session=True, stdout=subprocess.PIPE)
        reaper.watch(process.pid)
        pids[name] = process.pid
        if name == "stubborn":
            process.stdout.readline()  # SIGTERM ignored from now on
    reaper.unwatch(pids["stopped"])  # its owner stopped it itself (here: left it running)
    # an unrelated process whose id was "registered" under another start time: never hit
    other = int(sys.argv[2])
    reaper._send(f"+ {other}:1\\n")
    print(" ".join(f"{k}={v}" for k, v in pids.items()), flush=True)
    time.sleep(300)
    """
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state != "Z"


def _wait_gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_killed_owners_servers_end_and_nothing_else_does() -> None:
    bystander = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True
    )
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, "1.0", str(bystander.pid)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")},
    )
    try:
        assert owner.stdout is not None
        pids = dict(item.split("=") for item in owner.stdout.readline().split())
        plain, stubborn, stopped = (int(pids[k]) for k in ("plain", "stubborn", "stopped"))
        assert all(_alive(p) for p in (plain, stubborn, stopped))
        owner.send_signal(signal.SIGKILL)  # no cleanup of its own can run
        owner.wait(10)
        killed = time.monotonic()
        assert _wait_gone(plain, 5), "SIGTERM at the owner's death"
        assert _alive(stubborn) or time.monotonic() - killed >= 0.9, "killed before its grace"
        assert _wait_gone(stubborn, 10), "SIGKILL after the grace"
        assert time.monotonic() - killed >= 0.9
        assert _alive(stopped), "unwatched: left to whoever stopped it"
        assert bystander.poll() is None and _alive(bystander.pid), "an id reused: not ours"
    finally:
        for pid in pids.values() if "pids" in locals() else ():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        bystander.kill()
        bystander.wait()
        if owner.poll() is None:
            owner.kill()
