"""A consumer process killed with SIGKILL in the middle of handlers, five times, and
started again each time: every message is handled, none is lost, and no side effect
happens twice (the handler's writes commit with its key: see ``kill_target``).

The kills aim alternately at a handler that has just begun and at one that has just
written its effect but not returned. A control run without the transaction shows the
same kills do double effects, so the main test can fail."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pika

from delayq import Message
from delayq.sync import Publisher
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
MESSAGES = 1000
KILLS = 5


def _effects(db: Path) -> tuple[int, int, set[tuple[int, int]]]:
    """(distinct messages with an effect, effects beyond one per message, (n, pid) pairs)."""
    with sqlite3.connect(db, timeout=30) as conn:
        rows = conn.execute("SELECT n, pid FROM effects").fetchall()
    ns = [n for n, _ in rows]
    return len(set(ns)), len(ns) - len(set(ns)), {(n, p) for n, p in rows}


def _depth(url: str, queue: str) -> int:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ok = connection.channel().queue_declare(queue, passive=True)
        return int(ok.method.message_count)
    finally:
        connection.close()


class Target:
    """The consumer process under test."""

    def __init__(
        self, args: list[str], out: Path, module: str = "tests.integration.kill_target"
    ) -> None:
        self.args = args
        self.out = out
        self.module = module
        self.process: subprocess.Popen[bytes] | None = None
        self.pids: list[int] = []

    def start(self) -> None:
        with open(self.out, "ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", self.module, *self.args],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=out,
            )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line.strip() == b"ready", f"consumer did not start: {self.out.read_text()[-2000:]}"
        self.pids.append(self.process.pid)

    def kill(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def _kill_inside_a_handler(
    target: Target, started: Path, stage: str, timeout_s: float = 30
) -> None:
    """SIGKILL as soon as a handler reaches ``stage`` ("start" or "wrote"); it then
    pauses a few ms before going on, so the kill lands inside it."""
    marker = f"{stage} ".encode()
    offset = started.stat().st_size if started.exists() else 0
    deadline = time.monotonic() + timeout_s
    with open(started, "ab+") as log:
        while time.monotonic() < deadline:
            log.seek(offset)
            fresh = log.read()
            if marker in fresh:
                target.kill()
                return
            offset += len(fresh)
            time.sleep(0.0002)
    raise AssertionError(f"no handler reached {stage!r} within the time allowed")


def _run_with_kills(
    topo: Any,
    url: str,
    adapter: str,
    tmp_path: Path,
    *extra: str,
    messages: int = MESSAGES,
    drain_timeout_s: float = 120,
) -> tuple[int, int, int, list[int]]:
    """Publish, kill the consumer :data:`KILLS` times mid-handler, restart it each time,
    wait until every message has an effect; return (handled, doubles, interrupted, pids)."""
    queue = f"{topo.namespace}.work"
    db, started = tmp_path / "app.db", tmp_path / "started.log"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE effects (n INTEGER, pid INTEGER)")  # no unique key
    topo_file = tmp_path / "topology.json"
    topo_file.write_text(topo.model_dump_json())
    target = Target(
        ["--url", url, "--topology", str(topo_file), "--queue", queue, "--db", str(db),
         "--started", str(started), "--adapter", adapter, *extra],
        tmp_path / "consumer.err",
    )
    target.start()  # declares the topology
    with Publisher(url, topo) as pub:
        receipts = pub.publish_many(
            [Message({"n": n}, "job.k", "0s", message_id=f"k{n}") for n in range(messages)]
        )
    assert len(receipts) == messages  # all confirmed
    try:
        for kill in range(KILLS):
            goal = messages * (kill + 1) // (KILLS + 2)
            deadline = time.monotonic() + 60
            while _effects(db)[0] < goal:
                assert time.monotonic() < deadline, f"stuck below {goal} before kill {kill + 1}"
                time.sleep(0.05)
            _kill_inside_a_handler(target, started, "start" if kill % 2 == 0 else "wrote")
            target.start()
        deadline = time.monotonic() + drain_timeout_s
        while _effects(db)[0] < messages:
            assert time.monotonic() < deadline, f"only {_effects(db)[0]} of {messages} handled"
            time.sleep(0.2)
        time.sleep(2.0)  # let redeliveries of already handled messages come and go
    finally:
        target.stop()
    handled, doubles, pairs = _effects(db)
    begun = {
        (int(n), int(p))
        for stage, n, p in (line.split() for line in started.read_text().splitlines() if line)
        if stage == "start"
    }
    killed = set(target.pids[:-1])
    interrupted = len({(n, p) for n, p in begun if p in killed and (n, p) not in pairs})
    # A quorum queue's count can lag a little behind the acks of the stopped consumer.
    wait_for(
        lambda: _depth(url, queue) == 0 and _depth(url, f"{queue}.dlq") == 0,
        10,
        lambda: f"empty queues (work {_depth(url, queue)}, dlq {_depth(url, f'{queue}.dlq')})",
        interval_s=0.2,
    )
    return handled, doubles, interrupted, target.pids


def test_sigkill_in_the_middle_of_handlers_loses_nothing_and_runs_nothing_twice(
    make_topology, rabbitmq_url, driver_kind, tmp_path
):
    topo = make_topology(["1s"])
    handled, doubles, interrupted, _ = _run_with_kills(topo, rabbitmq_url, driver_kind, tmp_path)
    print(
        f"\n{driver_kind}: {MESSAGES} messages, {KILLS} SIGKILLs, {interrupted} handlers "
        f"killed mid-way, handled {handled}, lost {MESSAGES - handled}, doubles {doubles}"
    )
    assert handled == MESSAGES, "a message was lost"
    assert doubles == 0, "a side effect ran twice"
    assert interrupted >= KILLS // 2, "the kills did not land inside handlers"


def test_control_without_the_transaction_the_same_kills_run_effects_twice(
    make_topology, rabbitmq_url, tmp_path
):
    """Why transactional handlers exist: with the effect committed on its own, a kill
    after it and before the key's completion runs it again after the restart."""
    topo = make_topology(["1s"])
    handled, doubles, _, _ = _run_with_kills(
        topo, rabbitmq_url, "sync", tmp_path, "--no-transaction"
    )
    print(f"\ncontrol: handled {handled}, doubles {doubles}")
    assert handled == MESSAGES
    assert doubles >= 1
