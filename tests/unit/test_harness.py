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


def test_compose_runs_a_recent_management_image_with_a_health_check(compose):
    broker = compose["services"]["rabbitmq"]
    image, tag = broker["image"].split(":")
    assert image == "rabbitmq" and tag.endswith("-management")
    assert tuple(int(p) for p in tag.split("-")[0].split(".")) >= (3, 13)
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
