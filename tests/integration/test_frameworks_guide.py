"""The task frameworks guide's examples as written (docs/guides/task-frameworks.md): its
files, its worker command (the framework's own CLI) and its send script, on a real
broker; each delayed message is run once, no sooner than its delay."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pika
import pytest

from delayq import Topology
from delayq.sync import delete_topology
from tests.guide_blocks import ROOT, block, blocks

GUIDE = ROOT / "docs" / "guides" / "task-frameworks.md"
BIN = Path(sys.executable).parent


def _write(tmp_path: Path, *names: str) -> None:
    for name in names:
        (tmp_path / name).write_text(block(GUIDE, "python", f"# {name}"), encoding="utf-8")


def _command(starting: str) -> list[str]:
    """The guide's shell line that starts with ``starting``, without its ``&`` and comment."""
    lines = [line for lang, text in blocks(GUIDE) if lang == "sh" for line in text.splitlines()]
    (line,) = [line for line in lines if line.startswith(starting)]
    return line.split("#")[0].replace("&", "").split()


def _run_guide(
    tmp_path: Path, url: str, worker: str, send: str, expect: str, delay_s: float
) -> None:
    env = {**os.environ, "DELAYQ_URL": url, "PYTHONPATH": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    argv = _command(worker)
    log = (tmp_path / "worker.log").open("w")
    proc = subprocess.Popen(
        [str(BIN / argv[0]), *argv[1:]], cwd=tmp_path, env=env, stdout=log,
        stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        sent = time.monotonic()
        subprocess.run(
            [sys.executable, *_command(send)[1:]], cwd=tmp_path, env=env, check=True, timeout=120
        )
        deadline = time.monotonic() + 90
        while expect not in (tmp_path / "worker.log").read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "worker.log").read_text()
            time.sleep(0.1)
        seen = time.monotonic()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    output = (tmp_path / "worker.log").read_text()
    assert output.count(expect) == 1, output
    assert seen - sent >= delay_s - 0.5, (seen - sent, output)


def _clean(url: str, topology: Topology, queues: list[str], exchanges: list[str]) -> None:
    """The guide's topology (its namespace and ladder) and the framework's entities."""
    delete_topology(topology, url)
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    for queue in queues:
        channel.queue_delete(queue)
    for exchange in exchanges:
        channel.exchange_delete(exchange)
    connection.close()


@pytest.mark.slow
def test_the_dramatiq_example(tmp_path: Path, rabbitmq_url: str) -> None:
    _write(tmp_path, "dramatiq_tasks.py", "dramatiq_send.py")
    try:
        _run_guide(
            tmp_path, rabbitmq_url, "dramatiq dramatiq_tasks", "python dramatiq_send.py",
            "sent to ann@example.com", delay_s=5,
        )  # fmt: skip
    finally:
        topology = Topology(namespace="tasks", ladder=["1s", "5s", "1m", "1h"])
        _clean(rabbitmq_url, topology, ["emails", "emails.DQ", "emails.XQ"], [])


@pytest.mark.slow
def test_the_taskiq_example(tmp_path: Path, rabbitmq_url: str) -> None:
    _write(tmp_path, "taskiq_tasks.py", "taskiq_send.py")
    try:
        _run_guide(
            tmp_path, rabbitmq_url, "taskiq worker", "python taskiq_send.py", "reminded 2",
            delay_s=5,
        )  # fmt: skip
        assert "reminded 1" not in (tmp_path / "worker.log").read_text()  # due in a day
    finally:
        topology = Topology(namespace="jobs", ladder=["1s", "5s", "1m", "1h", "1d"])
        _clean(rabbitmq_url, topology, ["taskiq", "taskiq.dead_letter"], ["taskiq"])


@pytest.mark.slow
def test_the_faststream_example(tmp_path: Path, rabbitmq_url: str) -> None:
    _write(tmp_path, "faststream_app.py", "faststream_send.py")
    try:
        _run_guide(
            tmp_path, rabbitmq_url, "faststream run", "python faststream_send.py",
            "reminded 2", delay_s=5,
        )  # fmt: skip
        assert "reminded 1" not in (tmp_path / "worker.log").read_text()  # due in a day
    finally:
        topology = Topology(namespace="shop", ladder=["1s", "5s", "1m", "1h", "1d"])
        _clean(rabbitmq_url, topology, ["reminders", "payments", "payments.dlq"], [])


@pytest.mark.slow
def test_the_celery_example(tmp_path: Path, rabbitmq_url: str) -> None:
    _write(tmp_path, "celery_tasks.py", "celery_send.py")
    try:
        _run_guide(
            tmp_path, rabbitmq_url, "celery -A", "python celery_send.py", "invoiced 2",
            delay_s=5,
        )  # fmt: skip
        log = (tmp_path / "worker.log").read_text()
        assert "invoiced 1" not in log and log.count("invoiced 3") == 1, log
    finally:
        topology = Topology(namespace="shop-celery", ladder=["1s", "5s", "1m", "1h", "1d"])
        _clean(rabbitmq_url, topology, ["celery"], ["celery"])
