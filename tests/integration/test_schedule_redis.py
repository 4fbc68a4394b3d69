"""The schedule index on Redis (issue 51): every case of the unit suite that takes a
``store`` (``tests/unit/test_schedule_store.py``) runs here again against a real server,
then the cases only a server has: two clients of one prefix, a server that goes away,
and the hypothesis suite holding Redis to the pure filter."""

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
from tests.integration.store_servers import redis_client  # noqa: F401  (a fixture)
from tests.unit import test_schedule_store as unit_suite

BEHAVIOUR = servers.contract_cases(unit_suite, "store")
globals().update(BEHAVIOUR)


def test_the_shared_behaviour_suite_was_picked_up() -> None:
    assert len(BEHAVIOUR) >= 7, sorted(BEHAVIOUR)


@pytest.fixture
def schedules(redis_url: str, redis_client: Any) -> Iterator[Callable[..., Any]]:  # noqa: F811
    """Make RedisSchedules under fresh prefixes; their keys are deleted afterwards."""
    module = servers.client_module("delayq.schedule.redis", "redis")
    made: list[Any] = []

    def make(**kwargs: Any) -> Any:
        kwargs.setdefault("prefix", f"delayq:test:{uuid.uuid4().hex[:12]}:")
        made.append(module.RedisSchedule(kwargs.pop("url", redis_url), **kwargs))
        return made[-1]

    yield make
    for each in made:
        each.close()
        for name in redis_client.scan_iter(match=each.prefix + "*"):
            redis_client.delete(name)


@pytest.fixture
def store(schedules: Callable[..., Any]) -> Any:
    return schedules()


def test_two_clients_of_one_prefix_see_each_others_moves(schedules: Callable[..., Any]) -> None:
    first = schedules()
    second = schedules(prefix=first.prefix)
    first.add([unit_suite.entry(1), unit_suite.entry(2)])
    assert second.move(["m1", "m2"], State.SCHEDULED, now_ms=1) == [State.SCHEDULED] * 2
    assert first.move(["m1"], State.SCHEDULED, now_ms=2) == [State.SCHEDULED]  # no move back
    assert first.count(Query()) == 2


def test_a_server_that_is_not_there_is_a_store_error_and_the_url_is_checked(
    schedules: Callable[..., Any],
) -> None:
    with pytest.raises(StoreError, match="RedisSchedule"):
        schedules(url="redis://:s3cret@127.0.0.1:1/0")
    with pytest.raises(InvalidInput, match="bad Redis URL"):
        schedules(url="redis://127.0.0.1:notaport/0")


def test_the_password_stays_out_of_errors_and_repr(schedules: Callable[..., Any]) -> None:
    with pytest.raises(StoreError) as raised:
        schedules(url="redis://user:s3cret-pw@127.0.0.1:1/0")
    assert "s3cret-pw" not in str(raised.value)


def test_a_page_order_holds_across_namespaces_states_and_equal_due_times(store: Any) -> None:
    entries = [unit_suite.entry(n, due_at_ms=5_000, namespace=f"ns{n % 3}") for n in range(1_200)]
    store.add(entries)
    store.move([e.id for e in entries[::2]], State.SCHEDULED, now_ms=1)
    everything = Query(states=set(State))
    seen, after = [], None
    while page := store.find(everything, after=after, limit=250):
        seen += [e.id for e in page]
        after = (page[-1].due_at_ms, page[-1].id)
    assert seen == sorted(e.id for e in entries)
    assert store.count(everything) == 1_200
    assert store.count(Query(namespace="ns1", states={State.PENDING})) == 200


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(pairs=unit_suite._entries, query=unit_suite._queries, limit=st.integers(1, 40))
def test_redis_answers_a_query_as_the_filter_does(
    schedules: Callable[..., Any], pairs: list[Any], query: Query, limit: int
) -> None:
    from delayq.schedule.memory import MemorySchedule

    store = schedules()  # a fresh prefix for every example
    memory = MemorySchedule()
    for s in (memory, store):
        unit_suite.fill(s, pairs)
    expected = unit_suite.matching(memory, query)
    assert store.count(query) == len(expected)
    assert store.find(query, limit=limit) == expected[:limit]
    assert store.tiers(query) == unit_suite.by_tier(expected)


def test_the_command_line_reads_a_redis_index(
    schedules: Callable[..., Any], redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from delayq.cli import EXIT_BROKER, EXIT_OK, main

    store = schedules(prefix="delayq:schedule:")  # the command line's prefix
    store.add([unit_suite.entry(1)])
    store.move(["m1"], State.CANCELLED, now_ms=1)
    assert main(["scheduled", "show", "--index", redis_url, "--message-id", "m1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["entry"]["state"] == "cancelled"
    assert main(["scheduled", "expire", "--index", redis_url, "--older-than", "1s"]) == EXIT_OK
    assert store.get("m1") is None
    assert main(["scheduled", "show", "--index", redis_url, "--message-id", "m1"]) == EXIT_BROKER
    assert main(["scheduled", "show", "--index", "redis://127.0.0.1:1/0", "--message-id", "x"]) == 1


def test_the_tier_counters_follow_adds_moves_replaces_and_expiry(store: Any) -> None:
    """Counts by tier of a namespace's states come from counters the scripts keep."""
    entries = [unit_suite.entry(n, tier="1h" if n % 3 else "30s") for n in range(30)]
    store.add(entries)
    waiting = Query(namespace="shop", states={State.PENDING, State.SCHEDULED})
    assert store.tiers(waiting) == {"30s": 10, "1h": 20}
    store.move([e.id for e in entries[:12]], State.SCHEDULED, now_ms=1)
    store.move([e.id for e in entries[:6]], State.HANDLED, now_ms=2)
    assert store.tiers(Query(namespace="shop", states={State.SCHEDULED})) == {"30s": 2, "1h": 4}
    assert store.tiers(Query(namespace="shop", states={State.HANDLED})) == {"30s": 2, "1h": 4}
    store.add([unit_suite.entry(0, tier="1h")])  # a finished entry recorded again
    assert store.tiers(Query(namespace="shop", states={State.HANDLED})) == {"30s": 1, "1h": 4}
    assert store.expire(finished_before_ms=3) == 5
    assert store.tiers(Query(states={State.HANDLED})) == {}
    assert store.tiers(waiting) == {"30s": 8, "1h": 17}
    assert store.tiers(waiting) == unit_suite.by_tier(store.find(waiting, limit=100))


def test_an_id_moved_twice_in_one_batch_is_in_one_set_once(store: Any) -> None:
    """A script writes its sorted sets and counters at its end, one command each: an id
    met twice in a move's batch ends in its target set once, counted once."""
    entries = [unit_suite.entry(n) for n in range(4)]
    store.add(entries)
    store.move([e.id for e in entries], State.SCHEDULED, now_ms=1)
    twice = [entries[0].id, entries[1].id, entries[0].id]
    after = store.move(twice, State.RESCHEDULED, now_ms=2, due_at_ms=5_000_000, generation=2)
    assert after == [State.RESCHEDULED] * 3
    rescheduled = Query(namespace="shop", states={State.RESCHEDULED})
    assert [e.id for e in store.find(rescheduled, limit=10)] == sorted(twice[:2])
    assert store.count(rescheduled) == 2
    assert store.count(Query(namespace="shop", states={State.SCHEDULED})) == 2
    assert store.tiers(rescheduled) == unit_suite.by_tier(store.find(rescheduled, limit=10))
    store.move(twice, State.HANDLED, now_ms=3)
    assert store.expire(finished_before_ms=4) == 2  # each finished once, in its set once
    assert store.count(Query(namespace="shop", states={State.HANDLED})) == 0
