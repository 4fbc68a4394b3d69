"""`delayq worker MODULE:ATTR` runs an application's handlers and stops gracefully on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import yaml

from delayq import Message
from delayq.sync import Publisher, apply_topology

APP = """
import asyncio, json, time
from pathlib import Path
from delayq import Worker, load_topology

worker = Worker(load_topology(Path(__file__).with_name("topology.yaml")))
OUT = Path(__file__).with_name("effects.jsonl")

def effect(kind, value):
    with OUT.open("a") as out:
        out.write(json.dumps({"kind": kind, "n": value["n"]}) + "\\n")

@worker.handler("{ns}.work")
def plain(value):
    time.sleep(0.05)
    effect("sync", value)

@worker.handler("{ns}.other", prefetch=10)
async def coroutine(value):
    await asyncio.sleep(0.05)
    effect("async", value)
"""


def test_worker_runs_sync_and_async_handlers_and_stops_on_sigterm(
    make_topology, rabbitmq_url, tmp_path: Path
):
    ns = make_topology(["1s"]).namespace
    topo_data = {
        "namespace": ns,
        "ladder": ["1s"],
        "destinations": [
            {"queue": f"{ns}.work", "bindings": ["work.#"]},
            {"queue": f"{ns}.other", "bindings": ["other.#"]},
        ],
    }
    (tmp_path / "topology.yaml").write_text(yaml.safe_dump(topo_data))
    (tmp_path / "myapp.py").write_text(textwrap.dedent(APP).replace("{ns}", ns))
    from delayq import Topology

    topo = Topology.from_mapping(topo_data)
    apply_topology(topo, rabbitmq_url)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "delayq",
            "worker",
            "myapp:worker",
            "--url",
            rabbitmq_url,
            "--log-level",
            "warning",
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        with Publisher(rabbitmq_url, topo) as pub:
            pub.publish_many(
                [Message({"n": n}, f"work.{n}", "0s") for n in range(20)]
                + [Message({"n": n}, f"other.{n}", "1s") for n in range(20)]
            )
        out = tmp_path / "effects.jsonl"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            lines = out.read_text().splitlines() if out.exists() else []
            if len(lines) >= 40:
                break
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output
    assert "2 handlers" in output and "guest:guest" not in output
    effects = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(e["n"] for e in effects if e["kind"] == "sync") == list(range(20))
    assert sorted(e["n"] for e in effects if e["kind"] == "async") == list(range(20))
    from delayq.sync import delete_topology

    delete_topology(topo, rabbitmq_url)


def test_worker_with_a_bad_spec_says_what_to_declare(tmp_path: Path):
    (tmp_path / "empty.py").write_text("x = 1\n")
    run = subprocess.run(
        [sys.executable, "-m", "delayq", "worker", "empty:x", "--url", "amqp://localhost:1/"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2 and "is not a delayq.Worker" in run.stderr
