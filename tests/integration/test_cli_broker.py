"""The CLI against a real broker: publish prints a receipt; demo shows every arrival."""

from __future__ import annotations

import json
import subprocess
import sys

import yaml


def _delayq(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "delayq", *args], capture_output=True, text=True, timeout=timeout
    )


def test_cli_publish_prints_the_receipt_and_the_message_arrives(
    make_topology, rabbitmq_url, collect, tmp_path
):
    topo = make_topology(["1s", "2s"])
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(topo.model_dump(mode="json")))
    common = ["--file", str(path), "--url", rabbitmq_url]

    before = _delayq("publish", "-k", "job.cli", "-d", "1s", *common)
    assert before.returncode == 1
    assert "topology apply" in before.stderr

    assert _delayq("topology", "apply", *common).returncode == 0
    inbox = collect(f"{topo.namespace}.work")
    run = _delayq(
        "publish",
        "-k",
        "job.cli",
        "-d",
        "1500ms",
        "--body",
        '{"order": 7}',
        "--message-id",
        "cli-1",
        "--json",
        *common,
    )
    assert run.returncode == 0, run.stderr
    receipt = json.loads(run.stdout)
    assert receipt["message_id"] == "cli-1" and receipt["tier"] == "2s"
    assert receipt["lateness"] == "0:00:00.500000"
    [arrival] = inbox.wait(1, timeout_s=5)
    assert arrival.message_id == "cli-1" and arrival.body == b'{"order":7}'


def test_cli_demo_shows_every_message_arriving_never_early(rabbitmq_url):
    run = _delayq("demo", "--url", rabbitmq_url, "--messages", "12", timeout=90)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "12/12 arrived; 0 early" in run.stdout
    rows = [line for line in run.stdout.splitlines() if line.startswith("demo-")]
    assert len(rows) == 12
    assert "guest:guest" not in run.stdout
