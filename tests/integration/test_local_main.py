"""``python -m delayq.local``: a broker in one command, without root or Docker."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import pytest

from delayq import Topology, apply_topology
from delayq.local.node import server_installed

pytestmark = pytest.mark.integration


def _server_or_fail() -> None:
    if not server_installed():
        if os.environ.get("CI"):
            pytest.fail("rabbitmq-server is not installed (bash scripts/setup.sh installs it)")
        pytest.skip("rabbitmq-server is not installed")


def test_it_prints_a_url_that_works_and_stops_cleanly_on_sigterm() -> None:
    _server_or_fail()
    proc = subprocess.Popen(
        [sys.executable, "-m", "delayq.local", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline().strip()  # blocks until the node listens
        assert first.startswith("DELAYQ_URL=amqp://guest:guest@127.0.0.1:"), first
        url = first.removeprefix("DELAYQ_URL=")
        report = apply_topology(Topology(namespace="localmain", ladder=["1m"]), url)
        assert report.ok
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.stderr is not None
    assert "stopping the node" in proc.stderr.read()


def test_a_port_in_use_is_refused_with_what_to_do() -> None:
    _server_or_fail()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "delayq.local", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 1
    assert f"port {port} is in use" in done.stderr
    assert "--port 0" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_port_out_of_range_is_a_usage_error() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "delayq.local", "--port", "70000"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "--port must be from 0 to 65535" in done.stderr
