"""Transactional handlers against a real broker, both adapters: the handler's writes and
the key's completion commit together (SQLite and PostgreSQL), so duplicates, failures,
timeouts and store outages never leave an effect twice or none."""

from __future__ import annotations

import sqlite3
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from delayq import FixedBackoff, Message
from delayq.errors import InvalidInput
from delayq.stores.base import ClaimStatus
from delayq.stores.sqlite import SQLiteStore
from tests.integration.test_consumer import publish, until


@dataclass
class EffectDB:
    """A transactional store and the application table its handlers write."""

    store: Any
    insert: Callable[[Any, int], None]
    counts: Callable[[], dict[int, int]]


@pytest.fixture(params=["sqlite", "postgres"])
def effect_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[EffectDB]:
    if request.param == "sqlite":
        path = tmp_path / "app.db"
        store = SQLiteStore(path)
        with sqlite3.connect(path) as db:
            db.execute("CREATE TABLE effects (n INTEGER)")  # no unique key: doubles would show

        def counts() -> dict[int, int]:
            with sqlite3.connect(path) as db:
                rows = db.execute("SELECT n, COUNT(*) FROM effects GROUP BY n").fetchall()
            return {int(n): int(c) for n, c in rows}

        yield EffectDB(
            store, lambda tx, n: tx.execute("INSERT INTO effects VALUES (?)", (n,)), counts
        )
        store.close()
        return
    import psycopg

    from delayq import PostgresStore

    dsn = request.getfixturevalue("postgres_dsn")
    unique = uuid.uuid4().hex[:10]
    store = PostgresStore(dsn, table=f"idem_{unique}")
    table = f"effects_{unique}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (n INTEGER)")

    def pg_counts() -> dict[int, int]:
        with psycopg.connect(dsn, autocommit=True) as conn:
            rows = conn.execute(f"SELECT n, COUNT(*) FROM {table} GROUP BY n").fetchall()
        return {int(n): int(c) for n, c in rows}

    yield EffectDB(
        store, lambda tx, n: tx.execute(f"INSERT INTO {table} VALUES (%s)", (n,)), pg_counts
    )
    store.close()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.execute(f"DROP TABLE IF EXISTS idem_{unique}")


def test_duplicates_and_a_failed_first_attempt_leave_each_effect_once(
    make_topology, rabbitmq_url, start_consumer, effect_db
):
    topo = make_topology(["1s"])
    queue = f"{topo.namespace}.work"
    attempts: dict[int, int] = {}

    def handler(body: Any, tx: Any) -> None:
        n = body["n"]
        effect_db.insert(tx, n)
        attempts[n] = attempts.get(n, 0) + 1
        if n == 3 and attempts[n] == 1:
            raise RuntimeError("fails after writing: the write must roll back")

    consumer = start_consumer(
        topo,
        queue,
        handler,
        store=effect_db.store,
        transactional=True,
        policy=FixedBackoff(delay="1s", max_attempts=3),
    )
    batch = [Message({"n": n}, "job.t", "0s", message_id=f"m{n}") for n in range(5)]
    publish(rabbitmq_url, topo, *batch, *batch[:2])  # m0 and m1 twice
    assert until(lambda: consumer.stats.handled == 5 and consumer.stats.duplicates == 2, 15)
    consumer.stop()
    assert effect_db.counts() == {n: 1 for n in range(5)}
    assert attempts[3] == 2  # (retried also counts duplicates deferred while claimed)


def test_a_transactional_handler_past_its_timeout_never_commits_twice(
    make_topology, rabbitmq_url, start_consumer, effect_db
):
    """The first attempt overruns, is retried, and its thread tries to commit late: the
    claim it held was released, so exactly one of the two commits (never both)."""
    topo = make_topology(["1s"])
    queue = f"{topo.namespace}.work"
    calls: list[float] = []

    def handler(body: Any, tx: Any) -> None:
        calls.append(time.monotonic())
        effect_db.insert(tx, body["n"])
        if len(calls) == 1:
            time.sleep(2.0)

    consumer = start_consumer(
        topo,
        queue,
        handler,
        store=effect_db.store,
        transactional=True,
        handler_timeout="500ms",
        policy=FixedBackoff(delay="1s", max_attempts=5),
    )
    publish(rabbitmq_url, topo, Message({"n": 7}, "job.t", "0s", message_id="slow"))
    assert until(lambda: consumer.stats.retried >= 1, 10)
    assert until(lambda: consumer.stats.handled + consumer.stats.duplicates >= 1, 15)
    time.sleep(2.5)  # the abandoned first attempt has finished by now
    consumer.stop()
    assert effect_db.counts() == {7: 1}


def test_a_store_outage_returns_deliveries_and_the_consumer_goes_on(
    make_topology, rabbitmq_url, start_consumer, tmp_path
):
    class Flaky(SQLiteStore):
        failures = 2

        def run_batch(self, ops: Any) -> list[ClaimStatus | None]:
            if self.failures > 0:
                self.failures -= 1
                raise sqlite3.OperationalError("database is locked")
            return super().run_batch(ops)

    topo = make_topology(["1s"])
    queue = f"{topo.namespace}.work"
    seen: list[int] = []
    store = Flaky(tmp_path / "keys.db")
    consumer = start_consumer(topo, queue, lambda body: seen.append(body["n"]), store=store)
    consumer.consumer._return_pause_s = 0.1  # the async consumer's pause before requeueing
    publish(rabbitmq_url, topo, Message({"n": 1}, "job.s", "0s"), Message({"n": 2}, "job.s", "0s"))
    assert until(lambda: consumer.stats.handled == 2, 15)
    consumer.stop()
    store.close()
    assert sorted(seen) == [1, 2]
    assert consumer.stats.returned >= 1


def test_transactional_needs_a_transactional_store(make_topology, rabbitmq_url, start_consumer):
    from delayq import InMemoryStore

    topo = make_topology(["1s"])
    with pytest.raises(InvalidInput, match="SQLiteStore or PostgresStore"):
        start_consumer(
            topo,
            f"{topo.namespace}.work",
            lambda b, tx: None,
            store=InMemoryStore(),
            transactional=True,
        )
