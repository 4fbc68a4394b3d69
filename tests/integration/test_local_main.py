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
from delayq.local.rabbitmq import rabbit_server

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


@pytest.mark.parametrize("server", ["4.0", "4.3"])
def test_a_4_x_server_prints_a_url_of_a_node_of_that_server(server: str) -> None:
    """``--server 4.0`` / ``4.3`` whatever $DELAYQ_RABBITMQ_SERVER says: the node runs the
    version its tree holds (Debian testing moves: asserted by series, not pinned)."""
    import pika

    if not server_installed(server):
        pytest.fail(
            f"RabbitMQ {server} is not set up (bash scripts/setup-rabbitmq-4.sh {server} builds it)"
        )
    tree_version = rabbit_server(server).version
    assert tree_version.startswith(f"{server}."), tree_version
    env = {**os.environ, "DELAYQ_RABBITMQ_SERVER": "installed"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "delayq.local", "--port", "0", "--server", server],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline().strip()
        assert first.startswith("DELAYQ_URL=amqp://guest:guest@127.0.0.1:"), first
        connection = pika.BlockingConnection(pika.URLParameters(first.removeprefix("DELAYQ_URL=")))
        try:
            version = connection._impl.server_properties["version"]
        finally:
            connection.close()
        assert str(version.decode() if isinstance(version, bytes) else version) == tree_version
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_an_unknown_server_is_a_usage_error() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "delayq.local", "--server", "3.13"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "unknown RabbitMQ server '3.13'" in done.stderr
    assert "installed, 4.0, 4.3" in done.stderr


@pytest.mark.parametrize(
    ("server", "variable"), [("4.0", "DELAYQ_RABBITMQ_4_ROOT"), ("4.3", "DELAYQ_RABBITMQ_4_3_ROOT")]
)
def test_a_missing_4_x_tree_is_an_error_never_the_installed_server(
    tmp_path, server: str, variable: str
) -> None:
    env = {**os.environ, variable: str(tmp_path / "no-tree-here")}
    done = subprocess.run(
        [sys.executable, "-m", "delayq.local", "--port", "0", "--server", server],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 1 and "DELAYQ_URL" not in done.stdout
    assert f"RabbitMQ {server} is not set up" in done.stderr
    assert "setup-rabbitmq-4.sh" in done.stderr and variable in done.stderr
    assert "Traceback" not in done.stderr
