"""The README's quick start, run as a reader runs it: its topology applied with the CLI,
its worker.py and publish.py as files, then ``delayq dlq list`` against a real broker.

The blocks come from README.md itself (found by their first line, ``# publish.py``,
``# worker.py``, ``# topology/quickstart.yaml``), so an edit there that breaks the
quick start fails here.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pika
import pytest
import yaml

from delayq import load_topology
from delayq.sync import delete_topology
from tests.readme_examples import AMQP

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DELAYQ = [sys.executable, "-m", "delayq"]


def _block(first_line: str) -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    found = re.search(rf"```\w+\n({re.escape(first_line)}\n.*?)```", readme, re.S)
    assert found, f"README.md has no block starting {first_line!r}"
    return found.group(1)


def _sh_block_line(start: str) -> str:
    """The README line of a sh block that starts with ``start``."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for block in re.findall(r"```sh\n(.*?)```", readme, re.S):
        for line in block.splitlines():
            if line.startswith(start):
                return line
    raise AssertionError(f"README.md has no sh line starting {start!r}")


def _queue(url: str, name: str) -> tuple[int, int]:
    """(messages, consumers) of ``name``."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ok = connection.channel().queue_declare(name, passive=True).method
        return ok.message_count, ok.consumer_count
    finally:
        connection.close()


def _wait(what: str, check, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def test_the_readme_quick_start_retries_then_dead_letters_the_bad_email(
    rabbitmq_url: str, tmp_path: Path
) -> None:
    topology_text = _block("# topology/quickstart.yaml")
    assert yaml.safe_load(topology_text) == yaml.safe_load(
        (ROOT / "topology" / "quickstart.yaml").read_text()
    ), "the README's quick-start topology and topology/quickstart.yaml differ"
    (tmp_path / "topology").mkdir()
    (tmp_path / "topology" / "quickstart.yaml").write_text(topology_text)
    for name in ("publish.py", "worker.py"):
        block = _block(f"# {name}")
        # Issue 29: they hard-coded localhost right after the README said to export
        # DELAYQ_URL; they read it now, as every command below does (no --url).
        assert AMQP not in block and "localhost:5672/" not in block, block
        (tmp_path / name).write_text(block)
    topology = load_topology(tmp_path / "topology" / "quickstart.yaml")
    env = {**os.environ, "DELAYQ_URL": str(rabbitmq_url)}
    env.pop("RABBITMQ_URL", None)
    cli: dict[str, Any] = {
        "cwd": tmp_path,
        "capture_output": True,
        "text": True,
        "timeout": 120,
        "env": env,
    }

    applied = subprocess.run(
        [*DELAYQ, "topology", "apply", "--file", "topology/quickstart.yaml"], **cli
    )
    worker = None
    try:
        assert applied.returncode == 0, applied.stderr
        assert "created" in applied.stdout
        worker = subprocess.Popen(
            [sys.executable, "worker.py"],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        _wait("the worker to consume", lambda: _queue(rabbitmq_url, "emails")[1] == 1)

        published = subprocess.run([sys.executable, "publish.py"], **cli)
        assert published.returncode == 0, published.stderr
        bad_id = published.stdout.split("the bad one is")[1].strip()

        _wait("the bad email in emails.dlq", lambda: _queue(rabbitmq_url, "emails.dlq")[0] == 1)
        _wait("the 5 s email and the retry", lambda: _queue(rabbitmq_url, "emails")[0] == 0)
        listed = subprocess.run(
            [*DELAYQ, "dlq", "list", "emails", "--file", "topology/quickstart.yaml"], **cli
        )
        assert listed.returncode == 0, listed.stderr
        row = next(line for line in listed.stdout.splitlines() if line.startswith(bad_id))
        assert "email.welcome" in row
        assert "exhausted" in row
        assert "ValueError: no such address: nobody" in row
        assert re.search(r"\s2\s", row), row  # two attempts: the first and one retry

        # The last step, as written (issue 29: `delayq dlq replay emails` exited 2).
        replay = _sh_block_line("delayq dlq replay emails")
        argv = shlex.split(replay.split("#")[0])
        replayed = subprocess.run([*DELAYQ, *argv[1:]], **cli)  # `delayq` as installed
        assert replayed.returncode == 0, replayed.stdout + replayed.stderr
        assert "replayed 1 of 1 parked message from emails.dlq" in replayed.stdout
        # Sent back to emails, it fails twice more and is parked again, under its own id.
        _wait("the replayed email parked again", lambda: _queue(rabbitmq_url, "emails.dlq")[0] == 1)
        again = subprocess.run(
            [*DELAYQ, "dlq", "list", "emails", "--file", "topology/quickstart.yaml"], **cli
        )
        assert again.returncode == 0 and bad_id in again.stdout, again.stderr

        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0
        assert worker.stdout is not None
        out = worker.stdout.read()
        assert out.count("sent to ann@example.com") == 1, out
        assert out.count("sent to bob@example.com") == 1, out
    finally:
        if worker is not None and worker.poll() is None:
            worker.kill()
            worker.wait()
        delete_topology(topology, rabbitmq_url)
