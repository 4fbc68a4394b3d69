"""The broker-finding fixture and the docker-compose file, checked without a broker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]

NEEDS_BROKER = """
def test_needs_a_broker(rabbitmq_url):
    assert rabbitmq_url
"""


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
    assert image == "rabbitmq" and tag == "4.0-management"
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
# name does), then listens on $RABBITMQ_NODE_PORT like a node that started
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
time.sleep(60)
"""


def test_a_server_that_exits_before_listening_is_started_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import delayq.local.node as localnode

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("rabbitmq-server", FAKE_SERVER), ("rabbitmqctl", "#!/bin/sh\nexit 0\n")):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setattr(localnode, "RABBITMQ_BIN", bin_dir)
    node = localnode.LocalNode(tmp_path / "node")
    try:
        node.start(timeout_s=30)
        assert node.running
        assert "already running" in (tmp_path / "node" / "server.out").read_text()
    finally:
        if node._process is not None:
            node._process.kill()
            node._process.wait()


def test_a_server_that_keeps_exiting_fails_with_its_last_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import delayq.local.node as localnode

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "rabbitmq-server").write_text("#!/bin/sh\necho 'boot failed: eaddrinuse'\nexit 1\n")
    (bin_dir / "rabbitmq-server").chmod(0o755)
    monkeypatch.setattr(localnode, "RABBITMQ_BIN", bin_dir)
    node = localnode.LocalNode(tmp_path / "node")
    with pytest.raises(localnode.ServerExited) as caught:
        node.start(timeout_s=30, attempts=2)
    assert "exited with 1" in str(caught.value)
    assert "boot failed: eaddrinuse" in str(caught.value)
    assert (tmp_path / "node" / "server.out").read_text().count("boot failed") == 2
