"""A local node ends with the process that started it, even one killed with SIGKILL: a
CI stage killed half-way left 8 RabbitMQ nodes running for hours (issue 49)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from delayq.local.node import port_open, server_installed

pytestmark = pytest.mark.integration

OWNER = textwrap.dedent(
    """
    import time
    from delayq.local.node import LocalNode
    from delayq.local.probes import vm_of
    node = LocalNode().start()
    print(node.port, vm_of(node._process.pid), node.base_dir, flush=True)
    time.sleep(600)
    """
)


def test_a_node_whose_owner_is_killed_stops() -> None:
    if not server_installed():
        if os.environ.get("CI"):
            pytest.fail("the RabbitMQ server is not installed (bash scripts/setup.sh --test)")
        pytest.skip("the RabbitMQ server is not installed")
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")},
    )
    vm = None
    try:
        assert owner.stdout is not None
        line = owner.stdout.readline().split()  # the node listens and answers AMQP
        assert len(line) == 3, (line, owner.poll())
        port, vm, base_dir = int(line[0]), int(line[1]), line[2]
        assert port_open(port)
        owner.send_signal(signal.SIGKILL)  # nothing of the owner's own can run now
        owner.wait(10)
        deadline = time.monotonic() + 60
        while port_open(port) or Path(f"/proc/{vm}").exists():
            assert time.monotonic() < deadline, "the node outlived its owner by a minute"
            time.sleep(0.2)
    finally:
        if owner.poll() is None:
            owner.kill()
        if vm is not None and Path(f"/proc/{vm}").exists():
            os.kill(vm, signal.SIGKILL)
        if "base_dir" in locals():
            subprocess.run(["rm", "-rf", base_dir], check=False)
