"""delayq.spark.schedule against a real broker: 10,000 rows from a local Spark session."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from delayq import (
    ConnectionFailed,
    PublishUnconfirmed,
    RowsRejected,
    Settled,
    TopologyMissing,
)
from delayq.aio import AsyncConsumer
from delayq.message.bulk import key_message_id
from delayq.spark import schedule
from delayq.stores.memory import InMemoryStore
from delayq.sync import apply_topology
from tests.amqp import depth
from tests.spark.outputs import read_errors
from tests.waiting import wait_for as wait_until

ROWS = 10_000
DELAYS = ["0s", "500ms", "1s", "1500ms", "2s", "3s", "4s"]
TIER_OF = {
    "0s": "immediate",
    "500ms": "1s",
    "1s": "1s",
    "1500ms": "2s",
    "2s": "2s",
    "3s": "4s",
    "4s": "4s",
}
INVALID = [  # key, routing key, delay, body, expected error
    ("bad-delay", "job.a", "soon", None, "InvalidDelay"),
    ("bare-number", "job.a", "30", None, "InvalidDelay"),
    ("no-delay", "job.a", None, None, "InvalidDelay"),
    ("too-long", "job.a", "5s", None, "DelayTooLong"),
    ("nan-body", "job.a", "1s", float("nan"), "InvalidBody"),
    ("wildcard", "job.*", "1s", 1.0, "InvalidRoutingKey"),
    ("typo", "jbo.a", "1s", 3.0, "UnboundRoutingKey"),  # no binding matches: never sent
    (None, "job.a", "1s", 2.0, "InvalidMessageId"),
]


class Running:
    """An AsyncConsumer on its own event loop in a thread."""

    def __init__(self, consumer: AsyncConsumer) -> None:
        self.consumer = consumer
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run)
        self.thread.start()
        assert wait_for(lambda: getattr(consumer, "_stop_requested", None) is not None, 30)

    def _run(self) -> None:
        self.loop.run_until_complete(self.consumer.run(install_signal_handlers=False))

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.consumer.request_stop)
        self.thread.join(60)
        self.loop.close()


class Seen:
    """Counts each settled delivery's fate, and each handled body."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.handled: Counter[str] = Counter()
        self.outcomes: Counter[str] = Counter()
        self.events: dict[str, Settled] = {}

    async def handle(self, body: Any) -> None:
        with self.lock:
            self.handled[str(body["n"])] += 1

    def settled(self, event: Settled) -> None:
        with self.lock:
            self.outcomes[event.outcome] += 1
            if event.outcome == "ack":
                assert event.message_id is not None
                self.events[event.message_id] = event


def wait_for(predicate: Any, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def frame(spark: Any) -> Any:
    rows: list[tuple[Any, ...]] = [
        (f"k{n}", "job.a", DELAYS[n % len(DELAYS)], (n, None)) for n in range(ROWS)
    ]
    rows += [(key, rk, delay, (-1, body)) for key, rk, delay, body, _ in INVALID]
    return spark.createDataFrame(
        rows, "key string, routing_key string, delay string, body struct<n:int, x:double>"
    ).repartition(4)


def test_ten_thousand_rows_each_delivered_once_at_its_tier_then_rerun_gives_duplicates(
    spark: Any, rabbitmq_url: str, make_topology: Any, tmp_path: Path
) -> None:
    topology = make_topology()
    apply_topology(topology, rabbitmq_url)
    df = frame(spark)
    seen = Seen()
    running = Running(
        AsyncConsumer(
            rabbitmq_url,
            topology,
            f"{topology.namespace}.work",
            seen.handle,
            store=InMemoryStore(),
            prefetch=500,
            observers=[seen],
        )
    )
    try:
        progress: list[tuple[int, int]] = []
        summary = schedule(
            df,
            url=rabbitmq_url,
            topology=topology,
            delay_col="delay",
            errors_path=str(tmp_path / "errors"),
            progress=lambda done, total: progress.append((done, total)),
            max_rejected=len(INVALID),  # as many as there are: the job succeeds
        )
        expected_tiers = Counter(TIER_OF[DELAYS[n % len(DELAYS)]] for n in range(ROWS))
        assert summary.published == dict(expected_tiers)
        assert summary.total_rejected == len(INVALID)
        assert summary.errors == dict(Counter(e for *_, e in INVALID))
        assert summary.rejected == {"-": 4, "1s": 4}  # bad delays have no tier
        assert progress and progress[-1][0] <= progress[-1][1]

        errors = [
            json.loads(line)
            for part in (tmp_path / "errors").glob("part-*")
            for line in part.read_text().splitlines()
        ]
        by_key = {e.get("key"): e for e in errors}
        for key, _, _, _, error in INVALID:
            assert by_key[key]["error"] == error
            assert by_key[key]["reason"]
        assert "longer than the largest tier" in by_key["too-long"]["reason"]
        assert "did you mean 'job.a' (bound by 'job.#')?" in by_key["typo"]["reason"]

        assert wait_for(lambda: len(seen.handled) >= ROWS, 60), len(seen.handled)
        # The handler counts a body before the ack; the observer's event comes after it.
        assert wait_for(lambda: seen.outcomes["ack"] >= ROWS, 30), seen.outcomes
        assert all(count == 1 for count in seen.handled.values())
        assert set(seen.handled) == {str(n) for n in range(ROWS)}
        for n in range(ROWS):
            delay = DELAYS[n % len(DELAYS)]
            event = seen.events[key_message_id(topology.namespace, f"k{n}")]
            assert event.tier == TIER_OF[delay]
            assert event.published_at_ms is not None and event.tier_ms is not None
            assert event.received_at_ms >= event.published_at_ms + event.tier_ms

        # The same job again: the same ids, so the idempotent consumer skips them all.
        again = schedule(
            df, url=rabbitmq_url, topology=topology, delay_col="delay", max_rejected="0.1%"
        )
        assert again.published == summary.published
        assert len(again.rejections) == len(INVALID)
        assert wait_for(lambda: seen.outcomes["duplicate"] >= ROWS, 60), seen.outcomes
        time.sleep(0.5)
        assert seen.outcomes["duplicate"] == ROWS
        assert seen.outcomes["ack"] == ROWS
        assert all(count == 1 for count in seen.handled.values())
    finally:
        running.stop()


def test_due_times_become_delays_at_publish_and_the_past_is_immediate(
    spark: Any, rabbitmq_url: str, make_topology: Any
) -> None:
    # "soon" is 59-60 s ahead when the rows are made: Spark may take many seconds to
    # publish it on a loaded machine, and it must still land in the 1m tier, not later
    topology = make_topology(ladder=("1s", "2s", "4s", "1m"))
    apply_topology(topology, rabbitmq_url)
    now_s = time.time()
    df = spark.createDataFrame(
        [
            ("past", "job.a", "2000-01-01T00:00:00Z"),
            ("soon", "job.a", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now_s + 60))),
            ("later", "job.a", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now_s + 3600))),
            ("garbage", "job.a", "next tuesday"),
        ],
        "key string, routing_key string, due string",
    )
    summary = schedule(
        df, url=rabbitmq_url, topology=topology, due_col="due", body_col=None, max_rejected=2
    )
    assert summary.published.get("immediate") == 1
    assert sum(summary.published.values()) == 2
    assert summary.published == {"immediate": 1, "1m": 1}
    reasons = {r["key"]: r for r in summary.rejections}
    assert reasons["later"]["error"] == "DelayTooLong"
    assert reasons["garbage"]["error"] == "InvalidDelay"
    assert "not a timestamp" in reasons["garbage"]["reason"]


def test_rejected_rows_fail_the_job_once_the_rest_is_published_and_stale_errors_go(
    spark: Any, rabbitmq_url: str, make_topology: Any, tmp_path: Path
) -> None:
    topology = make_topology()
    apply_topology(topology, rabbitmq_url)
    work = f"{topology.namespace}.work"
    errors = tmp_path / "errors"
    rows = [("ok", "job.a", "0s"), ("bad", "job.a", "soon"), ("long", "job.a", "1h")]
    df = spark.createDataFrame(rows, "key string, routing_key string, delay string")

    with pytest.raises(RowsRejected) as caught:  # default: not one rejected row allowed
        schedule(
            df,
            url=rabbitmq_url,
            topology=topology,
            delay_col="delay",
            body_col=None,
            errors_path=str(errors),
        )
    message = str(caught.value)
    assert "2 of 3 rows were rejected (1 DelayTooLong, 1 InvalidDelay)" in message
    assert f"they are in {errors}" in message and "The other 1 were published" in message
    assert caught.value.summary.published == {"immediate": 1}
    assert sorted(e["key"] for e in read_errors(errors)) == ["bad", "long"]
    wait_until(lambda: depth(rabbitmq_url, work) == 1, 30, "the published row in its queue")

    every = spark.createDataFrame(rows[1:], "key string, routing_key string, delay string")
    with pytest.raises(RowsRejected, match="2 of 2 rows were rejected"):  # every row
        schedule(every, url=rabbitmq_url, topology=topology, delay_col="delay", body_col=None)
    accepted = schedule(
        every,
        url=rabbitmq_url,
        topology=topology,
        delay_col="delay",
        body_col=None,
        max_rejected="100%",
    )
    assert accepted.total_rejected == 2 and len(accepted.rejections) == 2

    # A clean run with the same errors path: the last run's rejections do not linger there
    clean = schedule(
        df.where("key = 'ok'"),
        url=rabbitmq_url,
        topology=topology,
        delay_col="delay",
        body_col=None,
        errors_path=str(errors),
    )
    assert clean.total_rejected == 0 and read_errors(errors) == []


def test_every_row_of_a_repeated_key_is_rejected_and_the_rest_published(
    spark: Any, rabbitmq_url: str, make_topology: Any
) -> None:
    topology = make_topology()
    apply_topology(topology, rabbitmq_url)
    # Two reminders for one customer keyed by the customer: one message id, so an
    # idempotent consumer would handle the first and skip the second as a duplicate.
    df = spark.createDataFrame(
        [
            ("cust-1", "job.a", "1s", "first"),
            ("cust-1", "job.a", "2s", "second"),
            ("cust-2", "job.a", "1s", "other"),
        ],
        "key string, routing_key string, delay string, body string",
    )
    with pytest.raises(RowsRejected, match=r"2 of 3 rows were rejected \(2 DuplicateKey\)"):
        schedule(df, url=rabbitmq_url, topology=topology, delay_col="delay")
    summary = schedule(df, url=rabbitmq_url, topology=topology, delay_col="delay", max_rejected=2)
    assert summary.published == {"1s": 1} and summary.duplicate_in_input == 2
    assert {r["key"] for r in summary.rejections} == {"cust-1"}
    assert "keep-last" in summary.rejections[0]["reason"]
    ns = topology.namespace
    wait_until(  # cust-2 once per run, through its tier; cust-1 never sent
        lambda: [depth(rabbitmq_url, q) for q in (f"{ns}.tier.1s", f"{ns}.tier.2s", f"{ns}.work")]
        == [0, 0, 2],
        30,
        "the two runs' copies of cust-2 in the work queue",
    )


def test_a_wrong_url_or_an_unapplied_topology_is_a_delayq_error_before_any_task(
    spark: Any, rabbitmq_url: str, make_topology: Any
) -> None:
    # Before: a Spark PythonException (pages of Java and Python stack) from every task.
    df = spark.createDataFrame(
        [("a", "job.a", "1s")], "key string, routing_key string, delay string"
    )
    applied = make_topology()
    apply_topology(applied, rabbitmq_url)
    with pytest.raises(ConnectionFailed):
        schedule(
            df,
            url="amqp://guest:guest@127.0.0.1:1/",
            topology=applied,
            delay_col="delay",
            body_col=None,
        )
    with pytest.raises(TopologyMissing, match="delayq topology apply"):
        schedule(df, url=rabbitmq_url, topology=make_topology(), delay_col="delay", body_col=None)


def test_a_task_s_delayq_error_is_raised_again_as_itself() -> None:
    from delayq.spark._checks import task_error

    text = (
        "An exception was thrown from the Python worker: Traceback (most recent call last):\n"
        '  File "worker.py", line 1, in main\n'
        "pika.exceptions.StreamLostError: Stream connection lost\n\n"
        "The above exception was the direct cause of the following exception:\n\n"
        "delayq.errors.PublishUnconfirmed: message 'm1' was not confirmed after 3 attempts\n"
    )
    error = task_error(RuntimeError(text))
    assert isinstance(error, PublishUnconfirmed)
    assert "'m1' was not confirmed" in str(error) and "raised in a Spark task" in str(error)
    # Tracebacks name exported errors by the package (delayq.PublishUnconfirmed).
    shown = text.replace("delayq.errors.PublishUnconfirmed", "delayq.PublishUnconfirmed")
    assert isinstance(task_error(RuntimeError(shown)), PublishUnconfirmed)
    assert task_error(RuntimeError("java.lang.OutOfMemoryError")) is None
