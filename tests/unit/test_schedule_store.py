"""The schedule index's stores (issue 51): states move forward only, a record of the same
id replaces only what is not live, and every store answers a query as the pure filter
does (a property test feeds random entries and queries to each)."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from delayq.errors import InvalidInput, StoreError
from delayq.schedule.base import ScheduleStore
from delayq.schedule.entry import FINISHED, WAITING, Entry, State, allowed_from, moves
from delayq.schedule.memory import MemorySchedule
from delayq.schedule.query import Query, page_key, topic_regex
from delayq.schedule.sqlite import SQLiteSchedule
from delayq.topology.topic import topic_matches


def entry(n: int, **fields: object) -> Entry:
    values: dict[str, object] = dict(
        namespace="shop", routing_key=f"orders.r{n % 3}", due_at_ms=1_000 + n, tier="30s",
        published_at_ms=0, size=10, destinations=("orders",), labels={"tenant": f"t{n % 2}"},
    )  # fmt: skip
    values.update(fields)
    return Entry(f"m{n}", **values)  # type: ignore[arg-type]


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ScheduleStore]:
    made: ScheduleStore = (
        MemorySchedule() if request.param == "memory" else SQLiteSchedule(tmp_path / "s.db")
    )
    yield made
    made.close()


def test_an_entry_is_pending_until_its_confirm_and_never_shown_as_scheduled(
    store: ScheduleStore,
) -> None:
    assert store.add([entry(1), entry(2)]) == [True, True]
    assert store.count(Query()) == 0
    assert store.count(Query(states={State.PENDING})) == 2
    assert store.move(["m1"], State.SCHEDULED, now_ms=5) == [State.SCHEDULED]
    assert store.move(["m2"], State.UNCONFIRMED, now_ms=5) == [State.UNCONFIRMED]
    assert [e.id for e in store.find(Query())] == ["m1"]
    assert store.move(["m2"], State.SCHEDULED, now_ms=6) == [State.UNCONFIRMED]
    got = store.get("m1")
    assert got is not None and got.state is State.SCHEDULED and got.changed_at_ms == 5


def test_the_requested_delay_is_kept_through_moves(store: ScheduleStore) -> None:
    """What a ladder recommendation fits (``delay_ms``), or ``None`` where not known."""
    store.add([entry(1, delay_ms=1_500), entry(2), entry(3, delay_ms=0)])
    store.move(["m1", "m2", "m3"], State.SCHEDULED, now_ms=5)
    store.move(["m1"], State.RESCHEDULED, now_ms=6, due_at_ms=9, generation=6, tier="1m")
    found = {e.id: e.delay_ms for e in store.find(Query(states=set(State)))}
    assert found == {"m1": 1_500, "m2": None, "m3": 0}
    for wrong in (-1, 1.5, True, "1s", 10**15):
        with pytest.raises(InvalidInput, match="delay_ms"):
            entry(4, delay_ms=wrong)


def test_an_index_an_older_delayq_made_gets_the_delay_column(tmp_path: Path) -> None:
    """A SQLite index made before entries kept their requested delay: opened, its rows
    read with none, and new entries keep theirs."""
    import sqlite3

    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.execute(
        "CREATE TABLE delayq_schedule (id TEXT PRIMARY KEY, namespace TEXT NOT NULL, "
        "routing_key TEXT NOT NULL, destinations TEXT NOT NULL, due_at_ms INTEGER NOT NULL, "
        "tier TEXT NOT NULL, published_at_ms INTEGER NOT NULL, size INTEGER NOT NULL, "
        "business_key TEXT, labels TEXT NOT NULL, state TEXT NOT NULL, generation INTEGER "
        "NOT NULL, changed_at_ms INTEGER NOT NULL, body BLOB, content_type TEXT, headers TEXT)"
    )
    db.execute(
        "INSERT INTO delayq_schedule VALUES ('old', 'shop', 'orders.r1', '[\"orders\"]', 5, "
        "'30s', 0, 10, NULL, '{}', 'scheduled', 0, 1, NULL, NULL, NULL)"
    )
    db.commit()
    db.close()
    for _ in range(2):  # opened again: the column is there already
        store = SQLiteSchedule(path)
        store.add([entry(1, delay_ms=20_000)])
        found = {e.id: e.delay_ms for e in store.find(Query(states=set(State)))}
        assert found == {"old": None, "m1": 20_000}
        store.close()


def test_reports_out_of_order_never_move_an_entry_back(store: ScheduleStore) -> None:
    store.add([entry(1)])
    # the consumer handled the copy before the publisher's confirm was read
    assert store.move(["m1"], State.HANDLED, now_ms=5) == [State.HANDLED]
    assert store.move(["m1"], State.SCHEDULED, now_ms=6) == [State.HANDLED]
    assert store.move(["m1"], State.DELIVERED, now_ms=7) == [State.HANDLED]
    assert store.move(["m1"], State.CANCELLED, now_ms=8) == [State.HANDLED]
    assert store.move(["nobody"], State.CANCELLED, now_ms=8) == [None]


def test_a_reschedule_moves_the_due_time_generation_and_tier(store: ScheduleStore) -> None:
    store.add([entry(1)])
    store.move(["m1"], State.SCHEDULED, now_ms=5)
    moved = store.move(["m1"], State.RESCHEDULED, now_ms=6, due_at_ms=9, generation=6, tier="1m")
    assert moved == [State.RESCHEDULED]
    got = store.get("m1")
    assert got is not None and (got.due_at_ms, got.generation, got.tier) == (9, 6, "1m")
    assert store.count(Query(due_before_ms=10)) == 1
    assert store.tiers(Query()) == {"1m": 1}
    with pytest.raises(InvalidInput, match="tier"):
        store.move(["m1"], State.RESCHEDULED, now_ms=7, tier="")


def test_a_second_record_of_a_live_id_keeps_the_first(store: ScheduleStore) -> None:
    store.add([entry(1), entry(2)])
    store.move(["m1"], State.SCHEDULED, now_ms=5)
    # m1 live: the second publish is a duplicate; m2 still pending: a resend replaces it
    again = [entry(1, due_at_ms=7), entry(2, due_at_ms=7)]
    assert store.add(again) == [False, True]
    assert [store.get(i).due_at_ms for i in ("m1", "m2")] == [1_001, 7]  # type: ignore[union-attr]
    store.move(["m1"], State.HANDLED, now_ms=6)
    assert store.add([entry(1, due_at_ms=8)]) == [True]  # over: a new message of that id


def test_a_cancelled_id_published_again_stays_cancelled_but_in_another_namespace(
    store: ScheduleStore,
) -> None:
    """The consumers skip a copy of a cancelled id (a cancel is final), so the entry
    stays cancelled, and is not shown waiting forever; a migration's record of the
    same id in another namespace replaces it."""
    store.add([entry(1), entry(2)])
    store.move(["m1", "m2"], State.CANCELLED, now_ms=5)
    assert store.add([entry(1, due_at_ms=8), entry(2, namespace="shop2")]) == [False, True]
    first, second = store.get("m1"), store.get("m2")
    assert first is not None and (first.state, first.due_at_ms) == (State.CANCELLED, 1_001)
    assert second is not None and (second.state, second.namespace) == (State.PENDING, "shop2")
    assert store.count(Query(states=set(State))) == 2


def test_filters_and_pages(store: ScheduleStore) -> None:
    store.add([entry(n) for n in range(10)])
    store.move([f"m{n}" for n in range(10)], State.SCHEDULED, now_ms=1)
    assert store.count(Query(labels={"tenant": "t1"})) == 5
    assert store.count(Query(routing_key="orders.r1")) == 3
    assert store.count(Query(routing_key="orders.*")) == 10
    assert store.count(Query(routing_key="#")) == 10
    assert store.count(Query(destination="orders")) == 10
    assert store.count(Query(destination="other")) == 0
    assert store.count(Query(due_after_ms=1_003, due_before_ms=1_005)) == 2
    assert store.count(Query(ids={"m1", "m4", "zz"})) == 2
    assert store.count(Query(namespace="other")) == 0
    seen: list[str] = []
    after = None
    while page := store.find(Query(), after=after, limit=3):
        seen += [e.id for e in page]
        after = page_key(page[-1])
    assert seen == [f"m{n}" for n in range(10)]


def test_expire_deletes_only_finished_entries_past_the_retention(store: ScheduleStore) -> None:
    store.add([entry(n) for n in range(4)])
    store.move(["m0", "m1", "m2"], State.SCHEDULED, now_ms=1)
    store.move(["m0"], State.HANDLED, now_ms=10)
    store.move(["m1"], State.CANCELLED, now_ms=20)
    assert store.expire(finished_before_ms=15) == 1
    assert store.get("m0") is None and store.get("m1") is not None
    assert store.count(Query(states=set(State))) == 3


def test_bad_input_is_refused_before_anything_is_written(store: ScheduleStore) -> None:
    with pytest.raises(InvalidInput, match="twice"):
        store.add([entry(1), entry(1)])
    with pytest.raises(InvalidInput, match="pending"):
        store.add([entry(2, state=State.SCHEDULED)])
    assert store.count(Query(states=set(State))) == 0
    with pytest.raises(InvalidInput, match="no state 'waiting'"):
        Query(states={"waiting"})  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="epoch milliseconds"):
        Query(due_before_ms=1.5)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="limit"):
        store.find(Query(), limit=0)
    with pytest.raises(InvalidInput, match="due_at_ms"):
        entry(3, due_at_ms=-1)
    with pytest.raises(InvalidInput, match="labels"):
        entry(3, labels={"tenant": 1})


@pytest.mark.parametrize(
    "to, values",
    [
        ("scheduled", {"now_ms": 1}),
        (State.SCHEDULED, {"now_ms": "1"}),
        (State.SCHEDULED, {"now_ms": -1}),
        (State.SCHEDULED, {"now_ms": True}),
        (State.RESCHEDULED, {"now_ms": 1, "due_at_ms": 1.5}),
        (State.RESCHEDULED, {"now_ms": 1, "generation": -3}),
        (State.RESCHEDULED, {"now_ms": 1, "due_at_ms": 10**15}),
    ],
)
def test_a_move_of_wrong_values_is_refused_and_changes_nothing(
    store: ScheduleStore, to: object, values: dict[str, object]
) -> None:
    store.add([entry(1)])
    with pytest.raises(InvalidInput, match=r"State|an int from 0 to"):
        store.move(["m1"], to, **values)  # type: ignore[arg-type]
    assert store.get("m1") == entry(1)


def test_a_closed_store_says_so(store: ScheduleStore) -> None:
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.count(Query())


def test_every_state_but_pending_is_reached_and_finished_states_are_left_only_forward() -> None:
    for to in State:
        if to is State.PENDING:
            assert not allowed_from(to)
            continue
        assert allowed_from(to), to
    for finished in FINISHED - {State.UNCONFIRMED}:
        assert not any(moves(finished, to) for to in WAITING)


def test_two_processes_of_one_sqlite_file_see_each_other(tmp_path: Path) -> None:
    first, second = SQLiteSchedule(tmp_path / "s.db"), SQLiteSchedule(tmp_path / "s.db")
    try:
        first.add([entry(1)])
        assert second.move(["m1"], State.SCHEDULED, now_ms=1) == [State.SCHEDULED]
        threads = [
            threading.Thread(target=s.move, args=(["m1"], to), kwargs={"now_ms": 2})
            for s, to in ((first, State.CANCELLED), (second, State.HANDLED))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        got = first.get("m1")
        assert got is not None and got.state in {State.CANCELLED, State.HANDLED}
    finally:
        first.close()
        second.close()


def test_sqlite_finds_and_moves_by_id_without_walking_every_waiting_entry(
    tmp_path: Path,
) -> None:
    """A move or a lookup by id (a purge's batches, a confirm's write) reads its rows by
    primary key: its work does not grow with the entries waiting. Before, SQLite walked
    the state index (every scheduled entry) per move: a purge of 100,000 among 1,000,000
    took 30 s. Counted in SQLite's VM steps, not in time."""
    store = SQLiteSchedule(tmp_path / "s.db")
    steps = [0]

    def counted() -> int:
        steps[0] += 1
        return 0

    def work(action: object) -> int:
        steps[0] = 0
        store._db.set_progress_handler(counted, 100)
        try:
            assert callable(action)
            action()
        finally:
            store._db.set_progress_handler(None, 100)
        return steps[0]

    try:
        sizes = {}
        for total in (200, 20_000):
            first = len(sizes) * 1_000_000
            batch = [entry(first + n) for n in range(total)]
            store.add(batch)
            store.move([e.id for e in batch], State.SCHEDULED, now_ms=1)
            ids = [e.id for e in batch[:10]]
            sizes[total] = (
                work(lambda ids=ids: store.move(ids, State.CANCELLED, now_ms=2)),
                work(lambda ids=ids: store.find(Query(ids=frozenset(ids)), limit=100)),
            )
        assert sizes[20_000][0] <= 2 * sizes[200][0] + 5, sizes
        assert sizes[20_000][1] <= 2 * sizes[200][1] + 5, sizes
    finally:
        store.close()


def test_entries_read_back_equal_those_written(store: ScheduleStore) -> None:
    """What a store rebuilds from its rows (unchecked, decoded once per distinct text)
    equals what was added, body, headers and all."""
    written = [
        entry(1),
        entry(2, body=b"\x00{}", content_type="application/json", headers={"a": [1, "b"]}),
        entry(3, labels={}, destinations=("a", "b"), business_key="k"),
    ]
    store.add(written)
    assert [store.get(e.id) for e in written] == written
    assert store.find(Query(states=frozenset(State)), limit=10) == written
    read = store.get("m2")
    assert read is not None and read.headers is not None and read.body == b"\x00{}"
    with pytest.raises(TypeError):
        read.labels["x"] = "y"  # type: ignore[index]


def test_a_path_that_cannot_hold_a_file_is_a_store_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(StoreError, match="cannot open the schedule index"):
        SQLiteSchedule(tmp_path / "file" / "s.db")
    with pytest.raises(InvalidInput, match="file path"):
        SQLiteSchedule(":memory:")


_entries = st.lists(
    st.builds(
        lambda n, key, due, tenant, dest, state, tier: (
            entry(
                n,
                routing_key=key,
                due_at_ms=due,
                labels={"tenant": tenant},
                destinations=dest,
                tier=tier,
            ),
            state,
        ),
        st.integers(0, 10_000),
        st.sampled_from(["a", "a.b", "a.b.c", "b.a", ""]),
        st.integers(0, 8),
        st.sampled_from(["x", "y"]),
        st.sampled_from([(), ("q1",), ("q1", "q2")]),
        st.sampled_from(list(State)),
        st.sampled_from(["30s", "1h"]),
    ),
    max_size=30,
    unique_by=lambda pair: pair[0].id,
)
_queries = st.builds(
    Query,
    states=st.sets(st.sampled_from(list(State)), min_size=1),
    routing_key=st.none() | st.sampled_from(["a", "a.*", "#", "a.#", "*.a", "#.c"]),
    destination=st.none() | st.sampled_from(["q1", "q2", "q3"]),
    due_after_ms=st.none() | st.integers(0, 8),
    due_before_ms=st.none() | st.integers(0, 8),
    labels=st.sampled_from([{}, {"tenant": "x"}, {"tenant": "z"}]),
)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(pairs=_entries, query=_queries, limit=st.integers(1, 40))
def test_every_store_answers_a_query_as_the_filter_does(
    tmp_path_factory: pytest.TempPathFactory,
    pairs: list[tuple[Entry, State]],
    query: Query,
    limit: int,
) -> None:
    path = tmp_path_factory.mktemp("schedule") / "s.db"
    stores: list[ScheduleStore] = [MemorySchedule(), SQLiteSchedule(path)]
    try:
        for s in stores:
            fill(s, pairs)
        expected = matching(stores[0], query)
        for s in stores:
            assert s.count(query) == len(expected)
            assert s.find(query, limit=limit) == expected[:limit]
            assert s.tiers(query) == by_tier(expected)
    finally:
        for s in stores:
            s.close()


def by_tier(entries: list[Entry]) -> dict[str, int]:
    found: dict[str, int] = {}
    for e in entries:
        found[e.tier] = found.get(e.tier, 0) + 1
    return found


def fill(store: ScheduleStore, pairs: list[tuple[Entry, State]]) -> None:
    """Add each entry and move it on to its state (through scheduled where it must)."""
    store.add([e for e, _ in pairs])
    for e, state in pairs:
        if state is not State.PENDING:
            first = state if state in {State.SCHEDULED, State.UNCONFIRMED} else None
            store.move([e.id], first or State.SCHEDULED, now_ms=1)
            store.move([e.id], state, now_ms=2)


def matching(store: ScheduleStore, query: Query) -> list[Entry]:
    """What the pure filter says ``query`` matches in ``store``, in page order."""
    every = store.find(Query(states=set(State)), limit=100)
    return sorted((e for e in every if query.matches(e)), key=page_key)


_words = st.sampled_from(["a", "b", "", "a-b", "x+y", "é", "*", "#"])


@settings(max_examples=400, deadline=None)
@given(
    pattern=st.lists(_words, max_size=4).map(".".join),
    key=st.lists(st.sampled_from(["a", "b", "", "a-b", "x+y", "é"]), max_size=4).map(".".join),
)
def test_the_topic_regex_of_sql_stores_matches_as_rabbitmq_does(pattern: str, key: str) -> None:
    subject = "." + key if key else ""
    assert bool(re.fullmatch(topic_regex(pattern), subject)) == topic_matches(pattern, key)


def test_a_commit_that_fails_says_its_own_error_not_the_rollbacks() -> None:
    """A full disk fails the COMMIT, and SQLite has rolled back already: the error said
    is the commit's ("disk is full"), not "cannot rollback - no transaction is active"."""
    import sqlite3

    from delayq.stores.sqlite import immediate

    class Full:
        in_transaction = False

        def execute(self, sql: str) -> None:
            if sql == "COMMIT":
                raise sqlite3.OperationalError("database or disk is full")
            if sql == "ROLLBACK":
                raise sqlite3.OperationalError("cannot rollback - no transaction is active")

    with pytest.raises(sqlite3.OperationalError, match="disk is full"):
        with immediate(Full()):  # type: ignore[arg-type]
            pass
