"""A poison message (its handler kills the process) and a crash-looping consumer: the
poison message reaches the DLQ after ``delivery_limit`` + 1 crashes, and the messages
prefetched behind it are handled, once each, never dead-lettered untouched.

The consumer runs in a child process (``poison_target``) started again after each
crash, as a supervisor would. Quorum queues charge every unacked delivery of a dead
connection to its ``x-delivery-count``: with a prefetch of 50, each crash used to
charge every prefetched neighbour, so after ``delivery_limit`` + 1 restarts the broker
dead-lettered them all. With an idempotency store, each crash also left a claim that
made the redelivery look busy elsewhere: it was deferred (republished, which resets
the broker's count) and came back to crash the process again, forever.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pika

from delayq import Message, Topology
from delayq.consume.delivery import H_DEAD_LETTER_REASON
from delayq.sync import Publisher, apply_topology
from tests.integration.poison_target import POISON_EXIT

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 3
NEIGHBOURS = 5


def _topology(make_topology: Any) -> Topology:
    made = make_topology(["1s"])  # a namespace that is deleted afterwards
    ns = made.namespace
    return Topology(
        namespace=ns,
        ladder=["1s"],
        destinations=[{"queue": f"{ns}.work", "bindings": ["job.#"], "delivery_limit": LIMIT}],
    )


def _log(path: Path) -> tuple[Counter[str], Counter[str]]:
    """(starts per id, completions per id) from the target's log."""
    starts: Counter[str] = Counter()
    done: Counter[str] = Counter()
    if path.exists():
        for line in path.read_text().splitlines():
            stage, ident, _pid = line.split()
            (starts if stage == "start" else done)[ident] += 1
    return starts, done


def _depth(url: str, queue: str) -> int:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        return int(connection.channel().queue_declare(queue, passive=True).method.message_count)
    finally:
        connection.close()


def _drain(url: str, queue: str) -> list[tuple[Any, bytes]]:
    """Every message in ``queue`` (properties, body), taken with a raw basic.get."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        got = []
        while True:
            method, props, body = channel.basic_get(queue, auto_ack=True)
            if method is None:
                return got
            got.append((props, body))
    finally:
        connection.close()


def _crash_loop(url: str, topo: Topology, tmp_path: Path, adapter: str, *extra: str) -> None:
    """Publish a poison message and its neighbours, run the target until every
    neighbour is done and a message is in the DLQ, starting it again after each
    crash."""
    queue = topo.destinations[0].queue
    apply_topology(topo, url)
    topo_file = tmp_path / "topology.json"
    topo_file.write_text(topo.model_dump_json())
    log = tmp_path / "handled.log"
    messages = [Message({"id": "poison", "poison": True}, "job.p", "0s", message_id="poison")]
    messages += [
        Message({"id": f"n{i}", "sleep_s": 0.3}, "job.p", "0s", message_id=f"n{i}")
        for i in range(NEIGHBOURS)
    ]
    with Publisher(url, topo) as pub:
        pub.publish_many(messages)
    argv = [
        sys.executable, "-m", "tests.integration.poison_target", "--url", url,
        "--topology", str(topo_file), "--queue", queue, "--log", str(log),
        "--adapter", adapter, *extra,
    ]
    runs = 0
    process: subprocess.Popen[bytes] | None = None
    deadline = time.monotonic() + 120
    try:
        with open(tmp_path / "target.err", "ab") as err:
            while len(_log(log)[1]) < NEIGHBOURS or _depth(url, f"{queue}.dlq") == 0:
                assert time.monotonic() < deadline, (
                    f"after {runs} runs, handled {sorted(_log(log)[1])}, "
                    f"{_depth(url, f'{queue}.dlq')} in the DLQ; "
                    f"{(tmp_path / 'target.err').read_text()[-3000:]}"
                )
                assert _depth(url, f"{queue}.dlq") <= 1, "an innocent was dead-lettered"
                if process is None or process.poll() is not None:
                    if process is not None:
                        assert process.returncode == POISON_EXIT, process.returncode
                    assert runs <= LIMIT + 2, f"still crashing after {runs} runs"
                    process = subprocess.Popen(argv, cwd=ROOT, stderr=err)
                    runs += 1
                time.sleep(0.1)
    finally:
        if process is not None and process.poll() is None:
            process.terminate()
            process.wait(30)


def _assert_outcome(url: str, topo: Topology, tmp_path: Path) -> list[tuple[Any, bytes]]:
    queue = topo.destinations[0].queue
    starts, done = _log(tmp_path / "handled.log")
    assert done == Counter({f"n{i}": 1 for i in range(NEIGHBOURS)}), done
    assert starts["poison"] == LIMIT + 1, starts  # tried, crashed, until past the limit
    dead = _drain(url, f"{queue}.dlq")
    assert [props.message_id for props, _ in dead] == ["poison"], "an innocent was dead-lettered"
    assert _drain(url, queue) == []
    return dead


def test_a_poison_message_is_dead_lettered_and_its_neighbours_are_handled(
    make_topology, rabbitmq_url, driver_kind, tmp_path
):
    topo = _topology(make_topology)
    _crash_loop(rabbitmq_url, topo, tmp_path, driver_kind)
    (props, _), = _assert_outcome(rabbitmq_url, topo, tmp_path)
    deaths = props.headers["x-death"]
    assert deaths[0]["reason"] == "delivery_limit", deaths  # the broker's backstop


def test_a_poison_message_with_a_store_reaches_the_dlq_instead_of_looping(
    make_topology, rabbitmq_url, driver_kind, tmp_path
):
    """Each crash leaves the poison message's claim behind (until its lease ends): its
    redelivery is deferred, which must not reset the count of crashes."""
    topo = _topology(make_topology)
    store = str(tmp_path / "keys.db")
    _crash_loop(rabbitmq_url, topo, tmp_path, driver_kind, "--store", store)
    (props, _), = _assert_outcome(rabbitmq_url, topo, tmp_path)
    headers = props.headers or {}
    reason = headers.get(H_DEAD_LETTER_REASON)
    if isinstance(reason, bytes):
        reason = reason.decode()
    deaths = headers.get("x-death") or []
    # Dead-lettered by delayq (the count carried across deferrals) or by the broker
    # (when the redelivery found the lease already over): either way, for its crashes.
    assert reason == "delivery-limit" or deaths[0]["reason"] == "delivery_limit", headers


