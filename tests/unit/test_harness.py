"""The broker-finding fixture and the docker-compose file, checked without a broker."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from delayq.local.node import LocalNode

ROOT = Path(__file__).resolve().parents[2]

NEEDS_BROKER = """
def test_needs_a_broker(rabbitmq_url):
    assert rabbitmq_url
"""


@pytest.fixture(autouse=True)
def _the_installed_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests fake the installed server's programs: whatever server the run's
    nodes use (``DELAYQ_RABBITMQ_SERVER=4.3``) is not theirs."""
    monkeypatch.delenv("DELAYQ_RABBITMQ_SERVER", raising=False)


def _run_pytest(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_needs_broker.py").write_text(NEEDS_BROKER)
    env = {k: v for k, v in os.environ.items() if k not in ("RABBITMQ_URL", "CI")}
    env["DELAYQ_RABBITMQ_BIN"] = str(tmp_path / "no-rabbitmq-here")
    env["DOCKER_HOST"] = "unix://" + str(tmp_path / "no-docker.sock")
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )


def test_no_broker_in_ci_is_a_failure_not_a_skip(tmp_path):
    run = _run_pytest(tmp_path, ci="true")
    assert run.returncode != 0, run.stdout
    assert "no RabbitMQ broker" in run.stdout
    assert "1 error" in run.stdout or "1 failed" in run.stdout


def test_no_broker_outside_ci_skips_and_says_how_to_get_one(tmp_path):
    run = _run_pytest(tmp_path, ci=None)
    assert run.returncode == 0, run.stdout
    assert "1 skipped" in run.stdout


BROKEN_NODE = """
import pytest

import delayq.pytest_plugin as plugin
from delayq.local.node import LocalNodeError


class Broken:
    def __init__(self, *args, **kwargs):
        pass

    def start(self):
        raise LocalNodeError("could_not_start_listener 18621 eaddrinuse")

    def cleanup(self):
        pass


@pytest.fixture(autouse=True)
def _installed_but_broken(monkeypatch):
    monkeypatch.setattr(plugin, "server_installed", lambda: True)
    monkeypatch.setattr(plugin, "LocalCluster", Broken)


def test_needs_a_cluster(local_rabbitmq_cluster):
    assert local_rabbitmq_cluster
"""


def test_an_installed_server_whose_node_does_not_start_fails_ci_or_not(tmp_path):
    """Session 33's CI printed `1 skipped` for the 4.3 cluster scenario: a node of the
    cluster failed to listen (a port drawn twice) and the fixture called that "no
    broker". A server that is there but does not start is a failure."""
    (tmp_path / "test_broken.py").write_text(BROKEN_NODE)
    env = {k: v for k, v in os.environ.items() if k not in ("RABBITMQ_URL", "CI")}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert run.returncode != 0, run.stdout
    assert "did not start" in run.stdout and "eaddrinuse" in run.stdout, run.stdout
    assert "skipped" not in run.stdout, run.stdout


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_compose_runs_the_tested_management_image_with_a_health_check(compose):
    """The default image is the line the local 4.x nodes run (the plugin's Docker
    fallback uses the same); DELAYQ_RABBITMQ_IMAGE picks another."""
    from delayq.pytest_plugin import DOCKER_IMAGE

    broker = compose["services"]["rabbitmq"]
    variable, default = broker["image"].strip("${}").split(":-", 1)
    assert variable == "DELAYQ_RABBITMQ_IMAGE" and default == DOCKER_IMAGE
    image, tag = default.split(":")
    assert image == "rabbitmq" and tag == "4.3-management"
    assert "delayq.ready" in " ".join(broker["healthcheck"]["test"])


def test_compose_takes_credentials_from_the_environment_and_no_guest(compose):
    env = compose["services"]["rabbitmq"]["environment"]
    assert env["RABBITMQ_DEFAULT_PASS"].startswith("${RABBITMQ_PASSWORD:?")
    assert env["RABBITMQ_DEFAULT_USER"] == "${RABBITMQ_USER:-delayq}"  # not guest


def test_compose_loads_the_committed_definitions(compose):
    volumes = compose["services"]["rabbitmq"]["volumes"]
    assert any(v.startswith("./topology/definitions.json:") for v in volumes)
    script = (ROOT / "docker" / "import-topology.sh").read_text()
    assert "import_definitions /etc/delayq/definitions.json" in script


FAKE_SERVER = """#!/usr/bin/env python3
# exits at once on its first run (as a server whose old instance still holds the
# name does), then listens on $RABBITMQ_NODE_PORT like a node that started, answering
# an AMQP client's protocol header with the start of a connection.start frame
import os, pathlib, socket, time
marker = pathlib.Path(os.environ["HOME"]) / "ran-once"
if not marker.exists():
    marker.write_text("x")
    print("ERROR: node with name already running")
    raise SystemExit(0)
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", int(os.environ["RABBITMQ_NODE_PORT"])))
server.listen()
while True:
    client, _ = server.accept()
    client.settimeout(5)
    try:
        if client.recv(8) == b"AMQP\\x00\\x00\\x09\\x01":
            client.sendall(b"\\x01\\x00\\x00\\x00\\x00\\x00\\x04\\x00\\x0a\\x00\\x0a")
    except OSError:
        pass
    client.close()
"""


def _fake_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server: str, ctl: str | None = None
) -> LocalNode:
    """A LocalNode whose ``rabbitmq-server`` (and ``rabbitmqctl``) are these scripts."""
    import delayq.local.node as localnode

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scripts = {"rabbitmq-server": server} | ({} if ctl is None else {"rabbitmqctl": ctl})
    for name, text in scripts.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setattr(localnode, "RABBITMQ_BIN", bin_dir)
    return localnode.LocalNode(tmp_path / "node")


def test_a_server_that_exits_before_listening_is_started_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctl = '#!/bin/sh\necho "$@" >> "$HOME/ctl-calls"\n'  # records what it was asked
    node = _fake_node(tmp_path, monkeypatch, FAKE_SERVER, ctl)
    try:
        node.start(timeout_s=30)
        assert node.running
        assert "already running" in (tmp_path / "node" / "server.out").read_text()
        # it logs no end of boot: after BOOT_LOG_WAIT_S the node is asked instead
        assert "await_startup" in (tmp_path / "node" / "ctl-calls").read_text()
    finally:
        if node._process is not None:
            node._process.kill()
            node._process.wait()


DYING_SERVER = """#!/usr/bin/env python3
# on its first run opens its AMQP listener, answers the start's two probes (the port,
# an AMQP client), then exits before its boot ends (as a 4.0.5 node did once in CI);
# on the next, boots for good ("alive")
import os, pathlib, socket
home = pathlib.Path(os.environ["HOME"])
first = not (home / "ran-once").exists()
(home / "ran-once").write_text("x")
if not first:
    (home / "alive").write_text("x")
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", int(os.environ["RABBITMQ_NODE_PORT"])))
server.listen()
answered = 0
while True:
    client, _ = server.accept()
    client.settimeout(5)
    try:
        if client.recv(8) == b"AMQP\\x00\\x00\\x09\\x01":
            client.sendall(b"\\x01\\x00\\x00\\x00\\x00\\x00\\x04\\x00\\x0a\\x00\\x0a")
            answered += 1
    except OSError:
        pass
    client.close()
    if first and answered:
        print("boot step failed: the node stops")
        raise SystemExit(1)
"""


def test_a_server_that_dies_after_listening_is_started_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctl = '#!/bin/sh\n[ -e "$HOME/alive" ] || { echo "node not running at all"; exit 69; }\n'
    node = _fake_node(tmp_path, monkeypatch, DYING_SERVER, ctl)
    try:
        node.start(timeout_s=60)
        assert node.running and (tmp_path / "node" / "alive").exists()
        assert "boot step failed" in (tmp_path / "node" / "server.out").read_text()
        assert "await_startup" not in (tmp_path / "node" / "server.out").read_text()
    finally:
        if node._process is not None:
            node._process.kill()
            node._process.wait()


def test_a_server_that_keeps_exiting_fails_with_its_last_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import delayq.local.node as localnode

    node = _fake_node(tmp_path, monkeypatch, "#!/bin/sh\necho 'boot failed: eaddrinuse'\nexit 1\n")
    with pytest.raises(localnode.ServerExited) as caught:
        node.start(timeout_s=30, attempts=2)
    assert "exited with 1" in str(caught.value)
    assert "boot failed: eaddrinuse" in str(caught.value)
    assert (tmp_path / "node" / "server.out").read_text().count("boot failed") == 2


def _one_shot_server(reply: bytes | None) -> tuple[int, threading.Thread]:
    """A listener that answers one client's first bytes with ``reply`` (``None``: says
    nothing and holds the connection for a while) and then closes."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def serve() -> None:
        client, _ = server.accept()
        with client, server:
            client.recv(8)
            if reply is None:
                time.sleep(3)
            else:
                client.sendall(reply)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return server.getsockname()[1], thread


@pytest.mark.parametrize(
    ("reply", "answers"),
    [
        (b"\x01\x00\x00\x00\x00\x01\xf4\x00\x0a\x00\x0a", True),  # connection.start
        (b"AMQP\x00\x00\x09\x01", False),  # a broker refusing the protocol version
        (b"HTTP/1.1 400 Bad Request\r\n\r\n", False),
        (b"", False),  # closed at once
        (None, False),  # silent
    ],
)
def test_only_a_broker_answering_an_amqp_client_counts_as_started(
    reply: bytes | None, answers: bool
) -> None:
    from delayq.local.probes import amqp_answers

    port, thread = _one_shot_server(reply)
    started = time.monotonic()
    assert amqp_answers(port, timeout_s=1.0) is answers
    assert time.monotonic() - started < 2.5  # a silent listener does not hold it
    thread.join(timeout=5)


def test_a_closed_port_does_not_answer() -> None:
    from delayq.local.node import free_port
    from delayq.local.probes import amqp_answers

    assert amqp_answers(free_port()) is False


SILENT_SERVER = """#!/usr/bin/env python3
# listens on $RABBITMQ_NODE_PORT and never speaks AMQP
import os, socket, time
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", int(os.environ["RABBITMQ_NODE_PORT"])))
server.listen(64)
time.sleep(120)
"""


def test_a_server_that_listens_but_never_answers_fails_in_bounded_time_and_is_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import delayq.local.node as localnode

    node = _fake_node(tmp_path, monkeypatch, SILENT_SERVER)
    started = time.monotonic()
    with pytest.raises(localnode.LocalNodeError, match="did not answer AMQP clients in time"):
        node.start(timeout_s=3)
    assert time.monotonic() - started < 20
    assert not node.running  # stopped (no Erlang VM to ask: killed), not left behind


def test_lines_waits_for_a_line_with_a_bound_and_says_what_was_read() -> None:
    """A child that never says what a test waits for fails the test (with what it said),
    instead of blocking until pytest's timeout ends the whole xdist worker (CI, stop 62)."""
    from tests.waiting import Lines

    script = "import sys, time\nprint('one', flush=True)\nprint('two three', flush=True)\n"
    script += "time.sleep(60) if sys.argv[1] == 'hang' else None\n"
    for how in ("hang", "exit"):
        child = subprocess.Popen(
            [sys.executable, "-c", script, how], stdout=subprocess.PIPE, text=True
        )
        try:
            assert child.stdout is not None
            said = Lines(child.stdout)
            assert said.until("three", "two", timeout_s=30) == "two three\n"
            with pytest.raises(AssertionError) as caught:
                said.until("four", timeout_s=0.5 if how == "hang" else 30)
            why = "0.5 s passed" if how == "hang" else "the pipe ended"
            assert f"{why} before a line said ['four']; it said:\none\ntwo three" in str(
                caught.value
            )
        finally:
            child.kill()
            child.wait(10)
        assert said.ended(10) == "one\ntwo three\n"
