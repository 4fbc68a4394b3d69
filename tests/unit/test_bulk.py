"""The pure part of bulk scheduling: rows to messages or rejections, ids from keys."""

from __future__ import annotations

from datetime import timedelta

import pytest

from delayq import Topology
from delayq.errors import PublishRejected
from delayq.message.bulk import (
    NO_TIER,
    BulkPlanner,
    Rejection,
    Row,
    describe_rejection,
    key_message_id,
    plain_body,
)
from delayq.message.envelope import OutgoingMessage, Receipt

NOW = 1_700_000_000_000
JOBS = [{"queue": "bulk.jobs", "bindings": ["job.*"]}]
TOPOLOGY = Topology(namespace="bulk", ladder=["1s", "2s", "4s"], destinations=JOBS)


def planner(**kwargs: object) -> BulkPlanner:
    return BulkPlanner(TOPOLOGY, clock_ms=lambda: NOW, **kwargs)  # type: ignore[arg-type]


def sent(row: Row, **kwargs: object) -> OutgoingMessage:
    planned = planner(**kwargs).plan(row)
    assert isinstance(planned, OutgoingMessage), planned
    return planned


def rejected(row: Row, **kwargs: object) -> Rejection:
    planned = planner(**kwargs).plan(row)
    assert isinstance(planned, Rejection), planned
    return planned


def test_the_message_id_comes_from_namespace_and_key() -> None:
    a = sent(Row("k1", "job.a", {"n": 1}, delay="1s"))
    b = sent(Row("k1", "job.b", {"n": 2}, delay="4s"))
    assert a.message_id == b.message_id == key_message_id("bulk", "k1")
    assert key_message_id("other", "k1") != a.message_id
    assert key_message_id("bulk", "k2") != a.message_id
    assert len(a.message_id) == 32


@pytest.mark.parametrize(
    ("due_in_ms", "tier", "delay_ms"),
    [(-60_000, None, 0), (0, None, 0), (1_500, "2s", 1_500), (4_000, "4s", 4_000)],
)
def test_a_due_time_becomes_a_delay_at_build_time(
    due_in_ms: int, tier: str | None, delay_ms: int
) -> None:
    msg = sent(Row("k", "job.a", None, due_at_ms=NOW + due_in_ms, due_text="t"))
    assert (msg.receipt.tier, msg.receipt.delay_ms) == (tier, delay_ms)


@pytest.mark.parametrize(
    ("row", "error", "tier", "words"),
    [
        (Row("k", "job.a", delay="soon"), "InvalidDelay", NO_TIER, "not a duration"),
        (Row("k", "job.a", delay=30), "InvalidDelay", NO_TIER, "bare number"),
        (Row("k", "job.a"), "InvalidDelay", NO_TIER, "no delay"),
        (Row("k", "job.a", delay="5s"), "DelayTooLong", NO_TIER, "largest tier"),
        (Row("k", "job.a", due_text="next tuesday"), "InvalidDelay", NO_TIER, "not a timestamp"),
        (Row("k", "job.a", float("nan"), delay="1s"), "InvalidBody", "1s", "cannot be encoded"),
        (Row("k", "job.*", delay="2s"), "InvalidRoutingKey", "2s", "wildcard"),
        (Row("k", None, delay="2s"), "InvalidRoutingKey", "2s", "empty"),
        (Row(None, "job.a", delay="0s"), "InvalidMessageId", "immediate", "no key"),
        (Row("", "job.a", delay="1s"), "InvalidMessageId", "1s", "no key"),
    ],
)
def test_rows_that_cannot_be_sent_become_rejections_with_the_reason(
    row: Row, error: str, tier: str, words: str
) -> None:
    rejection = rejected(row)
    assert (rejection.error, rejection.tier) == (error, tier)
    assert words in rejection.reason
    line = describe_rejection(rejection)
    assert set(line) == {"key", "routing_key", "delay", "tier", "error", "reason"}


def test_a_body_too_large_is_rejected() -> None:
    topology = Topology(
        namespace="bulk", ladder=["1s"], limits={"max_body_bytes": 1024}, destinations=JOBS
    )
    planned = BulkPlanner(topology).plan(Row("k", "job.a", "x" * 2000, delay="1s"))
    assert isinstance(planned, Rejection) and planned.error == "BodyTooLarge"


def test_table_cells_become_bodies() -> None:
    class SparkRow:  # what a struct column holds
        def asDict(self, recursive: bool = False) -> dict[str, object]:
            return {"n": 1, "inner": {"x": [1, 2]}}

    assert plain_body(SparkRow()) == {"n": 1, "inner": {"x": [1, 2]}}
    assert plain_body(bytearray(b"ab")) == b"ab"
    assert plain_body('{"a": 1}', json_text=True) == {"a": 1}
    assert plain_body('{"a": 1}') == '{"a": 1}'
    assert sent(Row("k", "job.a", '{"a": 1}', delay="1s"), body_json=True).body == b'{"a":1}'
    bad = rejected(Row("k", "job.a", "{oops", delay="1s"), body_json=True)
    assert bad.error == "InvalidBody" and "not valid JSON" in bad.reason
    assert sent(Row("k", "job.a", None, delay=timedelta(seconds=2))).receipt.tier == "2s"


def test_a_message_the_broker_refused_is_a_rejection_in_its_tier() -> None:
    msg = sent(Row("k", "job.a", None, delay="1500ms"))
    rejection = planner().rejected(msg, PublishRejected("nacked"), "k")
    assert (rejection.key, rejection.tier, rejection.error) == ("k", "2s", "PublishRejected")
    assert isinstance(msg.receipt, Receipt)


def test_an_exact_topology_schedules_through_the_cascade() -> None:
    exact = BulkPlanner(Topology(namespace="bulk", strategy="exact", destinations=JOBS))
    msg = exact.plan(Row("k", "job.a", None, delay="90s"))
    assert isinstance(msg, OutgoingMessage)
    assert (msg.receipt.tier, msg.receipt.tier_ms) == ("exact", 90_000)
    bad = exact.plan(Row("k", "job.a", float("nan"), delay="90s"))
    assert isinstance(bad, Rejection) and (bad.tier, bad.error) == ("exact", "InvalidBody")
    too_long = exact.plan(Row("k", "job.a", None, delay="3000d"))
    assert isinstance(too_long, Rejection) and too_long.tier == NO_TIER
