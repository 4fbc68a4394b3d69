"""The schedule index on PostgreSQL (issue 51): every case of the unit suite that takes a
``store`` (``tests/unit/test_schedule_store.py``) runs here again against a real server,
then the cases only a server has: two clients of one table, a broken connection, and
the DSN's password kept out of what the store shows."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from delayq.errors import InvalidInput, StoreError
from delayq.schedule.entry import State
from delayq.schedule.query import Query
from tests.integration import store_servers as servers
from tests.unit import test_schedule_store as unit_suite

BEHAVIOUR = servers.contract_cases(unit_suite, "store")
globals().update(BEHAVIOUR)


def test_the_shared_behaviour_suite_was_picked_up() -> None:
    assert len(BEHAVIOUR) >= 7, sorted(BEHAVIOUR)


@pytest.fixture
def schedules(postgres_dsn: str) -> Iterator[Callable[..., Any]]:
    """Make PostgresSchedules on fresh tables; dropped afterwards."""
    module = servers.client_module("delayq.schedule.postgres", "postgres")
    made: list[Any] = []

    def make(**kwargs: Any) -> Any:
        kwargs.setdefault("table", f"delayq_sched_{uuid.uuid4().hex[:12]}")
        made.append(module.PostgresSchedule(kwargs.pop("dsn", postgres_dsn), **kwargs))
        return made[-1]

    yield make
    psycopg = servers.client_module("psycopg", "postgres")
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        for each in made:
            each.close()
            conn.execute(f"DROP TABLE IF EXISTS {each.table}")


@pytest.fixture
def store(schedules: Callable[..., Any]) -> Any:
    return schedules()


def test_two_clients_of_one_table_see_each_others_moves(schedules: Callable[..., Any]) -> None:
    first = schedules()
    second = schedules(table=first.table)
    first.add([unit_suite.entry(1), unit_suite.entry(2)])
    assert second.move(["m1", "m2"], State.SCHEDULED, now_ms=1) == [State.SCHEDULED] * 2
    assert first.move(["m1"], State.SCHEDULED, now_ms=2) == [State.SCHEDULED]  # no move back
    assert first.count(Query()) == 2


def test_a_table_an_older_delayq_made_gets_the_delay_column(
    schedules: Callable[..., Any], postgres_dsn: str
) -> None:
    psycopg = servers.client_module("psycopg", "postgres")
    table = f"delayq_sched_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE {table} (id TEXT PRIMARY KEY, namespace TEXT NOT NULL,"
            " routing_key TEXT NOT NULL, destinations TEXT[] NOT NULL,"
            " due_at_ms BIGINT NOT NULL, tier TEXT NOT NULL, published_at_ms BIGINT NOT NULL,"
            " size BIGINT NOT NULL, business_key TEXT, labels JSONB NOT NULL,"
            " state TEXT NOT NULL, generation BIGINT NOT NULL, changed_at_ms BIGINT NOT NULL,"
            " body BYTEA, content_type TEXT, headers JSONB)"
        )
        conn.execute(
            f"INSERT INTO {table} VALUES ('old', 'shop', 'orders.r1', ARRAY['orders'], 5,"
            " '30s', 0, 10, NULL, '{}', 'scheduled', 0, 1, NULL, NULL, NULL)"
        )
    store = schedules(table=table)
    store.add([unit_suite.entry(1, delay_ms=20_000)])
    found = {e.id: e.delay_ms for e in store.find(Query(states=set(State)))}
    assert found == {"old": None, "m1": 20_000}
    assert schedules(table=table).count(Query(states=set(State))) == 2  # opened again


def test_a_broken_connection_is_a_store_error_then_reconnects(
    schedules: Callable[..., Any], postgres_dsn: str
) -> None:
    store = schedules()
    store.add([unit_suite.entry(1)])
    psycopg = servers.client_module("psycopg", "postgres")
    with psycopg.connect(postgres_dsn, autocommit=True) as admin:
        pid = store._conn.info.backend_pid
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    with pytest.raises(StoreError):
        store.count(Query(states=set(State)))
    assert store.count(Query(states=set(State))) == 1


def test_the_password_stays_out_of_errors_and_repr(schedules: Callable[..., Any]) -> None:
    module = servers.client_module("delayq.schedule.postgres", "postgres")
    dsn = "postgresql://delayq:s3cret-pw@127.0.0.1:1/nowhere"
    with pytest.raises(StoreError) as raised:
        module.PostgresSchedule(dsn, connect_timeout_s=1)
    assert "s3cret-pw" not in str(raised.value) and "***" in str(raised.value)
    with pytest.raises(InvalidInput, match="plain SQL identifier"):
        schedules(table="x; DROP TABLE y")


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(pairs=unit_suite._entries, query=unit_suite._queries, limit=st.integers(1, 40))
def test_postgres_answers_a_query_as_the_filter_does(
    store: Any, pairs: list[Any], query: Query, limit: int
) -> None:
    from delayq.schedule.memory import MemorySchedule

    with store._session() as conn:  # one table for every example, emptied for each
        conn.execute(f"TRUNCATE {store.table}")
    memory = MemorySchedule()
    for s in (memory, store):
        unit_suite.fill(s, pairs)
    expected = unit_suite.matching(memory, query)
    assert store.count(query) == len(expected)
    assert store.find(query, limit=limit) == expected[:limit]
    assert store.tiers(query) == unit_suite.by_tier(expected)
