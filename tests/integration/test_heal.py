"""``delayq topology heal`` and ``delayq worker --heal`` against a real node.

A real stall on one node: with the ready exchange deleted, a quorum tier keeps
its expired messages as dead letters (at-least-once) that do not move. On one
node no other member can lead, so ``--move-leaders`` must say it failed; the
leader move itself is proven on three nodes by tests/faults/test_cluster_node_loss.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

from delayq.local.node import LocalNode, free_port
from delayq.sync import apply_topology
from tests.integration.ops import delayq, stall_1s_tier


def _args(node: LocalNode, path: Path) -> list[str]:
    assert node.management_url is not None
    return ["--file", str(path), "--url", node.url, "--management-url", node.management_url]


def _heal_until_stalled(args: list[str]) -> subprocess.CompletedProcess[str]:
    """``delayq topology heal --json`` until it finds the stall (the management API's
    figures lag the queue by up to its statistics interval)."""
    deadline = time.monotonic() + 30
    while True:
        run = delayq(
            "topology", "heal", *args, "--threshold", "2s", "--interval", "500ms", "--json"
        )
        if run.returncode != 0 or time.monotonic() > deadline:
            return run


def test_a_stall_is_found_reported_and_exits_1(
    local_rabbitmq_management_node: LocalNode, node_topology
) -> None:
    node = local_rabbitmq_management_node
    topology, path = node_topology(node, ("1s", "30s"))
    ns = topology.namespace
    apply_topology(topology, node.url)
    stall_1s_tier(node, topology, 4)
    args = _args(node, path)
    try:
        run = _heal_until_stalled(args)
        assert run.returncode == 1, run.stdout + run.stderr
        [stall] = json.loads(run.stdout)["stalls"]
        assert stall["queue"] == f"{ns}.tier.1s" and stall["waiting"] == 4
        assert stall["outcome"] == "detected" and stall["stalled_s"] >= 2
        assert "not healed; run again with --move-leaders" in run.stderr

        text = delayq("topology", "heal", *args, "--threshold", "2s", "--interval", "500ms")
        assert text.returncode == 1
        assert f"{ns}.tier.1s holds 4 dead letters that have not moved for" in text.stdout
        assert "watching" in text.stdout and "1 queue holds dead letters" in text.stdout

        # One node: no other member to lead. Said, and still exit 1.
        moved = delayq(
            "topology", "heal", *args, "--threshold", "2s", "--interval", "500ms",
            "--move-leaders", "--json",
        )  # fmt: skip
        assert moved.returncode == 1
        [stall] = json.loads(moved.stdout)["stalls"]
        assert stall["outcome"] == "failed" and stall["detail"] == "no other member is online"
    finally:
        apply_topology(topology, node.url)  # the ready exchange back


def test_a_healthy_topology_passes_at_once(
    local_rabbitmq_management_node: LocalNode, node_topology
) -> None:
    node = local_rabbitmq_management_node
    topology, path = node_topology(node, ("1s", "30s"))
    apply_topology(topology, node.url)
    started = time.monotonic()
    run = delayq("topology", "heal", *_args(node, path), "--threshold", "60s")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "no dead letters stalled" in run.stdout
    assert time.monotonic() - started < 50  # not the whole threshold: nothing was held


def test_an_unreachable_management_api_is_an_error_not_a_pass(
    local_rabbitmq_node: LocalNode, node_topology
) -> None:
    node = local_rabbitmq_node
    _, path = node_topology(node)
    dead = f"http://guest:guest@127.0.0.1:{free_port()}/"
    run = delayq("topology", "heal", "--file", str(path), "--url", node.url,
                 "--management-url", dead)  # fmt: skip
    assert run.returncode == 1, run.stdout + run.stderr
    assert "cannot be reached" in run.stderr and "Traceback" not in run.stderr
    assert "guest:guest" not in run.stderr


APP = """
from pathlib import Path
from delayq import Worker, load_topology

worker = Worker(load_topology(Path(__file__).with_name("topology.yaml")))

@worker.handler("{ns}.work")
def handle(value):
    pass
"""


def test_the_worker_runs_the_watchdog_and_counts_stalls_in_its_metrics(
    local_rabbitmq_management_node: LocalNode, node_topology, tmp_path: Path
) -> None:
    node = local_rabbitmq_management_node
    topology, path = node_topology(node, ("1s", "30s"))
    ns = topology.namespace
    apply_topology(topology, node.url)
    (tmp_path / "topology.yaml").write_text(path.read_text())
    (tmp_path / "myapp.py").write_text(textwrap.dedent(APP).replace("{ns}", ns))
    stall_1s_tier(node, topology, 4)
    port = free_port()
    assert node.management_url is not None
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "delayq",
            "worker",
            "myapp:worker",
            "--url",
            node.url,
            "--heal",
            "--heal-threshold",
            "2s",
            "--heal-interval",
            "500ms",
            "--management-url",
            node.management_url,
            "--metrics-port",
            str(port),
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        deadline = time.monotonic() + 45
        series = f'delayq_dead_letter_stalls_total{{outcome="detected",queue="{ns}.tier.1s"}} 1.0'
        text = ""
        while series not in text and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    text = r.read().decode()
            except OSError:
                pass
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        apply_topology(topology, node.url)
    assert series in text, output
    assert proc.returncode == 0, output
    assert "Watchdog(" in output and f"{ns}.tier.1s holds 4 dead letters" in output
    assert "guest:guest" not in output


def test_watch_logs_each_stall_and_stops_on_sigterm(
    local_rabbitmq_management_node: LocalNode, node_topology
) -> None:
    node = local_rabbitmq_management_node
    topology, path = node_topology(node, ("1s", "30s"))
    apply_topology(topology, node.url)
    stall_1s_tier(node, topology, 3)
    env = {k: v for k, v in os.environ.items() if k not in ("DELAYQ_MANAGEMENT_URL", "DELAYQ_URL")}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "delayq",
            "topology",
            "heal",
            *_args(node, path),
            "--watch",
            "--threshold",
            "2s",
            "--interval",
            "500ms",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**env, "PYTHONUNBUFFERED": "1"},
    )
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # until the stall is logged (the test's timeout bounds it)
            lines.append(line)
            if f"{topology.namespace}.tier.1s holds 3 dead letters" in line:
                break
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        apply_topology(topology, node.url)
    output = "".join(lines) + rest
    assert proc.returncode == 0, output
    assert "no remedy configured" in output and "Traceback" not in output
