"""A consumer's retention against its topology: cancel marks must outlive every copy.

The figure (``delayq.consume.retention``) and the check the consumers make when built
(sync, async, memory twins alike): a retention shorter than the largest wait + the
retry horizon + the margin is refused with both figures and the fix, unless the
consumer has no store (nothing to retain) or opts out. See ``docs/concepts/cancel.md``.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from delayq import InMemoryStore, Topology
from delayq.consume.retention import (
    RETENTION_MARGIN_MS,
    check_mark_retention,
    needed_retention,
)
from delayq.consume.retry import ExponentialBackoff, FixedBackoff, ScheduleBackoff, default_policy
from delayq.errors import InvalidInput
from delayq.testing import MemoryBroker

H = 3_600_000
DAY = 24 * H
TOPOLOGY = Topology(
    namespace="ret",
    ladder=["1m", "1h", "24h"],
    destinations=[{"queue": "orders", "bindings": ["order.*"]}],
)


def _noop(body: Any) -> None:
    pass


async def _async_noop(body: Any) -> None:
    pass


# --- the figure -----------------------------------------------------------------------------------


def test_the_need_is_the_largest_tier_plus_the_routed_retries_plus_the_margin() -> None:
    policy = ScheduleBackoff.of(["30s", "5m", "2h"])  # routed: 1m, 1h, 24h
    need = needed_retention(TOPOLOGY, policy)
    assert (need.largest_wait_ms, need.retry_horizon_ms, need.retries) == (DAY, 60_000 + H + DAY, 3)
    assert need.margin_ms == RETENTION_MARGIN_MS == DAY
    assert need.total_ms == DAY + (60_000 + H + DAY) + DAY
    assert "the largest tier 24h" in str(need) and "a margin of 24h" in str(need)


def test_the_default_policy_fits_the_default_retention_on_a_day_ladder() -> None:
    need = needed_retention(TOPOLOGY, default_policy(TOPOLOGY))
    # 30s, 1m, 2m, 4m requested: routed to the 1m tier, then 1h (2m and 4m round up).
    assert need.retry_horizon_ms == 60_000 + 60_000 + H + H
    assert need.total_ms < 7 * DAY
    assert check_mark_retention(7 * DAY, TOPOLOGY, default_policy(TOPOLOGY)) == need


def test_exact_strategy_counts_the_cascade_maximum_and_routes_retries_through_it() -> None:
    exact = Topology(
        namespace="ret",
        ladder=["1m"],
        strategy="exact",
        exact={"unit": "1s", "levels": 17},  # (2**17 - 1) s: about 36 h, beyond the 1m tier
        destinations=[{"queue": "orders", "bindings": ["order.*"]}],
    )
    need = needed_retention(exact, FixedBackoff(delay="90s", max_attempts=3))
    assert need.largest_wait_ms == (2**17 - 1) * 1000
    assert "exact cascade's maximum" in need.largest_wait
    assert need.retry_horizon_ms == 2 * 90_000  # the cascade waits exactly, no tier rounding


def test_a_tiered_topology_with_the_cascade_declared_counts_the_longer_of_both() -> None:
    both = Topology(
        namespace="ret",
        ladder=["1m"],
        exact={"unit": "1s", "levels": 12},  # 4095 s > 1m: a publish may choose exact
        destinations=[{"queue": "orders", "bindings": ["order.*"]}],
    )
    assert needed_retention(both, FixedBackoff(delay="1m")).largest_wait_ms == 4_095_000


def test_a_policy_of_one_attempt_has_no_retry_horizon() -> None:
    need = needed_retention(TOPOLOGY, FixedBackoff(delay="1m", max_attempts=1))
    assert (need.retry_horizon_ms, need.retries) == (0, 0)
    assert need.total_ms == 2 * DAY


def test_too_short_names_both_figures_and_the_fix() -> None:
    with pytest.raises(InvalidInput) as caught:
        check_mark_retention(DAY, TOPOLOGY, FixedBackoff(delay="1h"), queue="orders")
    text = str(caught.value)
    assert "retention 24h of the consumer of 'orders'" in text
    assert "52h = " in text  # 24h + 4 x 1h + 24h: the need, in full
    assert "the largest tier 24h" in text and "4h of retries (4)" in text
    assert "at least 52h" in text and "check_retention=False" in text


# --- at consumer construction ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_consumers_refuse_a_too_short_retention_with_a_store(kind: str) -> None:
    policy = ExponentialBackoff(initial="1m", max_delay="24h", max_attempts=8)
    options: dict[str, Any] = {"store": InMemoryStore(), "retention": "3d", "policy": policy}
    with MemoryBroker() as broker:
        broker.apply(TOPOLOGY)
        with pytest.raises(InvalidInput, match=r"retention 72h .* shorter than a cancel mark"):
            if kind == "sync":
                broker.consumer(TOPOLOGY, "orders", _noop, **options)
            else:
                asyncio.run(broker.async_consumer(TOPOLOGY, "orders", _async_noop, **options))


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_consumers_take_a_retention_that_covers_the_need(kind: str) -> None:
    policy = ScheduleBackoff.of(["1m", "1h"])
    need = needed_retention(TOPOLOGY, policy).total_ms
    options: dict[str, Any] = {
        "store": InMemoryStore(),
        "retention": timedelta(milliseconds=need),  # exactly the need: enough
        "policy": policy,
    }
    handled: list[Any] = []

    async def handle(body: Any) -> None:
        handled.append(body)

    with MemoryBroker() as broker:
        broker.apply(TOPOLOGY)

        async def scenario() -> None:
            if kind == "sync":
                broker.consumer(TOPOLOGY, "orders", handled.append, **options)
            else:
                await broker.async_consumer(TOPOLOGY, "orders", handle, **options)
            broker.publisher(TOPOLOGY).publish({"n": 1}, "order.x", "1m", message_id="m-1")
            await broker.advance_async("2m")

        asyncio.run(scenario())
    assert handled == [{"n": 1}]


def test_without_a_store_any_retention_is_taken() -> None:
    with MemoryBroker() as broker:
        broker.apply(TOPOLOGY)
        broker.consumer(TOPOLOGY, "orders", _noop, retention="2h")


def test_the_opt_out_takes_a_short_retention_with_a_store() -> None:
    with MemoryBroker() as broker:
        broker.apply(TOPOLOGY)
        broker.consumer(
            TOPOLOGY, "orders", _noop, store=InMemoryStore(), retention="2h", check_retention=False
        )


def test_a_store_that_keeps_no_marks_is_not_checked() -> None:
    class PlainStore:  # the IdempotencyStore protocol only: no cancel_batch
        blocking = False

        def __init__(self) -> None:
            self.inner = InMemoryStore()

        def claim(self, key: str, *, lease_ms: int, now_ms: int) -> Any:
            return self.inner.claim(key, lease_ms=lease_ms, now_ms=now_ms)

        def complete(self, key: str, *, now_ms: int) -> None:
            self.inner.complete(key, now_ms=now_ms)

        def release(self, key: str) -> None:
            self.inner.release(key)

        def prune(self, *, older_than_ms: int) -> int:
            return self.inner.prune(older_than_ms=older_than_ms)

        def close(self) -> None:
            self.inner.close()

    with MemoryBroker() as broker:
        broker.apply(TOPOLOGY)
        broker.consumer(TOPOLOGY, "orders", _noop, store=PlainStore(), retention="2h")


def test_a_store_ttl_shorter_than_the_need_is_refused_too() -> None:
    class TtlStore(InMemoryStore):  # as a RedisStore(retention_ms=...) is
        retention_ms = 2 * H

        def __repr__(self) -> str:
            return "TtlStore()"

    with MemoryBroker() as broker:
        broker.apply(TOPOLOGY)
        with pytest.raises(InvalidInput, match=r"TtlStore\(\) retention_ms 2h .* at least"):
            broker.consumer(TOPOLOGY, "orders", _noop, store=TtlStore())
        broker.consumer(TOPOLOGY, "orders", _noop, store=TtlStore(), check_retention=False)
