"""delayq.spark.schedule through a broker outage: a local node of this module's own is
stopped in the middle of a job (its publishers held by a memory alarm until then, see
:class:`Outage`), and started again.

Waited out (``retry_for`` longer than the outage): the job ends well, says how many rows
it sent again, and a consumer with an idempotency store handles each row once. Not
waited out: the job fails with its summary, every unconfirmed row named in the errors
output, and ``resume_from`` sends just those.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from delayq import RowsUnconfirmed
from delayq.local.node import LocalNode
from delayq.spark import schedule
from delayq.stores.memory import InMemoryStore
from delayq.sync import Consumer, apply_topology
from tests.amqp import depth
from tests.spark.outputs import read_errors
from tests.waiting import wait_for

ROWS = 30_000
INVALID = 3  # rows with a bad delay: rejected, never unconfirmed

RESEND_MS = 15_000
"""The node's ``dead_letter_worker_publisher_confirm_timeout`` (180 s by default on
3.10.8). A restarted node's quorum tier may expire its messages (the 1 s rows parked at
the stop) before the work queue has started: its dead-letter worker sends them again only
after this timeout (docs/operations/deployment.md). At 180 s the consumer's waits below
would have to outlast CI's limit of a test; with 15 s they allow for it."""


@pytest.fixture(scope="module")
def outage_node(local_rabbitmq_node: LocalNode, _delayq_nodes: Any) -> LocalNode:
    """A node these tests stop and start, beside the session's (which keeps its settings;
    asked for first: it skips or fails, as the session says, without rabbitmq-server)."""
    node: LocalNode = _delayq_nodes.start(
        advanced_config=(
            f"[{{rabbit, [{{dead_letter_worker_publisher_confirm_timeout, {RESEND_MS}}}]}}].\n"
        )
    )
    return node


class Handled:
    """A sync Consumer in a thread, counting each body it handled."""

    def __init__(self, url: str, queue: str, topology: Any) -> None:
        self.url, self.queue = url, queue
        self.lock = threading.Lock()
        self.counts: Counter[int] = Counter()
        self.consumer = Consumer(
            url, topology, queue, self.handle, store=InMemoryStore(), prefetch=500
        )
        self.consumer.start()
        self.thread = threading.Thread(
            target=self.consumer.run, kwargs={"install_signal_handlers": False}, daemon=True
        )
        self.thread.start()

    def handle(self, body: Any) -> None:
        with self.lock:
            self.counts[int(body["n"])] += 1

    def each_row_once(self) -> None:
        """Wait until every row was handled and the work queue drained (duplicates of the
        rows sent again skipped), then check that no row was handled twice."""
        wait_for(
            lambda: len(self.counts) >= ROWS,
            120,
            lambda: f"{ROWS} rows handled (now {len(self.counts)})",
        )
        wait_for(lambda: depth(self.url, self.queue) == 0, 30, "the work queue to drain")
        assert set(self.counts) == set(range(ROWS))
        assert set(self.counts.values()) == {1}

    def stop(self) -> None:
        self.consumer.request_stop()
        self.thread.join(60)


def frame(spark: Any, rows: int = ROWS) -> Any:
    """``rows`` rows (half immediate, half 1 s) and a few bad ones, made in the JVM."""
    from pyspark.sql import functions as F

    good = spark.range(rows, numPartitions=2).select(
        F.concat(F.lit("k"), F.col("id").cast("string")).alias("key"),
        F.lit("job.a").alias("routing_key"),
        F.when(F.col("id") % 2 == 1, F.lit("0s")).otherwise(F.lit("1s")).alias("delay"),
        F.struct(F.col("id").cast("int").alias("n")).alias("body"),
        F.concat(F.lit("ref-"), F.col("id").cast("string")).alias("ref"),
    )
    bad = spark.range(INVALID, numPartitions=1).select(
        F.concat(F.lit("bad"), F.col("id").cast("string")).alias("key"),
        F.lit("job.a").alias("routing_key"),
        F.lit("soon").alias("delay"),
        F.struct(F.lit(-1).alias("n")).alias("body"),
        F.concat(F.lit("bad-ref-"), F.col("id").cast("string")).alias("ref"),
    )
    return good.unionByName(bad)


class Outage:
    """Holds the job's publishing, then stops ``node`` while the job publishes, and starts
    it again ``down_s`` later, or when told (``down_s`` None).

    The input is read once, before anything is sent, and the publishing then goes as fast
    as the broker confirms: so the node first raises a memory alarm (publishers blocked,
    nothing confirmed), waits until a connection of the job has published and is
    ``blocked``, then stops (the alarm is a runtime setting: the restart clears it). The
    job cannot end before the stop, however long the stop takes."""

    def __init__(self, node: LocalNode, down_s: float | None) -> None:
        self.node, self.down_s = node, down_s
        self.stopped_at: float | None = None
        self.started_at: float | None = None
        self.release = threading.Event()
        self.failure: BaseException | None = None
        node.ctl("set_vm_memory_high_watermark", "0.000001")
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _blocked(self) -> bool:
        return self.release.is_set() or "blocked" in self.node.ctl("list_connections", "state")

    def _run(self) -> None:
        try:
            wait_for(self._blocked, 180, "a publishing connection of the job blocked")
            self.node.stop()
            self.stopped_at = time.monotonic()
            if self.down_s is not None:
                self.release.wait(self.down_s)
            else:
                self.release.wait()
            self.node.start()
            self.started_at = time.monotonic()
        except BaseException as exc:
            self.failure = exc

    def end(self) -> None:
        """Start the node now (if it is down) and wait until it accepts connections."""
        self.release.set()
        self.thread.join(180)
        assert self.failure is None, self.failure
        assert not self.thread.is_alive()


def applied(node: LocalNode, make_topology: Any) -> tuple[Any, str]:
    """A throwaway topology applied on ``node``, and its work queue."""
    topology = make_topology()
    apply_topology(topology, node.url)
    return topology, f"{topology.namespace}.work"


def test_a_broker_stopped_mid_job_is_waited_out_and_each_row_is_handled_once(
    spark: Any, outage_node: LocalNode, make_topology: Any, tmp_path: Path
) -> None:
    node = outage_node
    topology, queue = applied(node, make_topology)
    outage = Outage(node, down_s=5)
    started = time.monotonic()
    try:
        summary = schedule(
            frame(spark),
            url=node.url,
            topology=topology,
            delay_col="delay",
            errors_path=str(tmp_path / "errors"),
            window=500,
            retry_for="90s",
            backoff="100ms",
            max_rejected=INVALID,
        )
        finished = time.monotonic()
    finally:
        outage.end()
    assert outage.stopped_at is not None and outage.started_at is not None
    assert outage.stopped_at < finished, "the node should stop while the job runs"
    assert outage.started_at < finished, "the job should outlast the outage"
    print(
        f"job {finished - started:.1f} s; node"
        f" down {outage.stopped_at - started:.1f}-{outage.started_at - started:.1f} s; "
        f"{summary.retried} retried"
    )
    assert summary.total_published == ROWS
    assert summary.unconfirmed == {} and summary.total_unconfirmed == 0
    assert summary.published == {"immediate": ROWS // 2, "1s": ROWS // 2}
    assert summary.total_rejected == INVALID
    assert 0 < summary.retried <= 2 * 500  # what was in flight at the stop, per partition
    assert "retried: " in summary.render()
    assert {e["error"] for e in read_errors(tmp_path / "errors")} == {"InvalidDelay"}

    handled = Handled(node.url, queue, topology)
    try:
        handled.each_row_once()
    finally:
        handled.stop()


def test_a_broker_gone_longer_than_retry_for_fails_the_job_with_its_summary_then_resume(
    spark: Any, outage_node: LocalNode, make_topology: Any, tmp_path: Path
) -> None:
    node = outage_node
    topology, queue = applied(node, make_topology)
    errors = tmp_path / "errors"
    outage = Outage(node, down_s=None)
    try:
        with pytest.raises(RowsUnconfirmed) as raised:
            schedule(
                frame(spark),
                url=node.url,
                topology=topology,
                delay_col="delay",
                errors_path=str(errors),
                window=500,
                retry_for="2s",
                backoff="100ms",
                max_rejected=INVALID,
                id_col="ref",
            )
    finally:
        outage.end()
    summary = raised.value.summary
    message = str(raised.value)
    assert "NOT counted as published" in message and f"--resume {errors}" in message
    assert "confirmed nothing for 2s" in message
    assert summary.total_unconfirmed > 0
    assert summary.total_published + summary.total_unconfirmed == ROWS
    assert summary.total_rejected == INVALID
    assert "unconfirmed: " in summary.render()
    lines = read_errors(errors)
    unconfirmed = {e["key"] for e in lines if e["error"] == "PublishUnconfirmed"}
    assert len(unconfirmed) == summary.total_unconfirmed
    assert all(
        e["reason"].startswith("unconfirmed: the broker confirmed nothing for 2s")
        for e in lines
        if e["error"] == "PublishUnconfirmed"
    )
    assert {(e["key"], e["ref"]) for e in lines if e["error"] == "InvalidDelay"} == {
        (f"bad{n}", f"bad-ref-{n}") for n in range(INVALID)
    }
    # The id column is carried into the unconfirmed rows too.
    assert all(e["ref"] == f"ref-{e['key'][1:]}" for e in lines if e["key"] in unconfirmed)

    # Every row counted as published reached the broker: nothing unconfirmed in that count.
    handled = Handled(node.url, queue, topology)
    try:
        published = {n for n in range(ROWS) if f"k{n}" not in unconfirmed}
        wait_for(
            lambda: published <= set(handled.counts),
            120,
            lambda: f"the {len(published)} published rows handled",
        )
        # The same input, resumed from that errors output: only the unconfirmed rows go.
        again = schedule(
            frame(spark),
            url=node.url,
            topology=topology,
            delay_col="delay",
            errors_path=str(tmp_path / "errors-2"),
            resume_from=str(errors),
            id_col="ref",
        )
        assert again.total_published == len(unconfirmed)
        assert again.total_rejected == 0 and again.total_unconfirmed == 0
        handled.each_row_once()
    finally:
        handled.stop()
