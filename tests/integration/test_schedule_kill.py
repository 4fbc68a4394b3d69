"""The schedule index's promises with the publishing process killed (SIGKILL) at each
step, on a real broker, both adapters (issue 51):

* after the pending write, before the send (``add``): the entry shows ``pending``, the
  message is not at the broker;
* after the broker's confirm, before the confirm's write (``move``): the entry shows
  ``pending``, the message is at the broker;
* at any moment of a long run (from outside), single publishes and a batch of 12,000
  recorded in steps beside its sends:

and in every case each message whose publish returned to the caller is ``scheduled``,
every ``scheduled`` entry's message is at the broker (never one that was not confirmed),
and every message at the broker has an entry. The publisher is
``tests/integration/schedule_kill_target.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pika
import pytest

from delayq.schedule.entry import State
from delayq.schedule.query import Query
from delayq.schedule.sqlite import SQLiteSchedule
from delayq.sync import apply_topology
from delayq.topology.model import Topology
from tests.amqp import depth
from tests.integration.test_sigkill import Target
from tests.waiting import wait_for


def at_broker(url: str, queue: str) -> set[str]:
    """The message ids ``queue`` holds (taken: the test's own namespace)."""
    found: set[str] = set()
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        while True:
            method, props, _ = channel.basic_get(queue, auto_ack=True)
            if method is None:
                return found
            found.add(props.message_id)
    finally:
        connection.close()


def lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


@pytest.mark.parametrize("adapter", ["sync", "async"])
@pytest.mark.parametrize(
    "kill, batch",
    [("add:5", 1), ("move:5", 1), ("none", 1), ("none", 12_000)],
    ids=["after-pending-write", "after-confirm", "from-outside", "from-outside-batch"],
)
def test_a_publisher_killed_at_each_step_never_shows_an_unconfirmed_message_as_scheduled(
    adapter: str,
    kill: str,
    batch: int,
    make_topology: Callable[..., Topology],
    rabbitmq_url: str,
    tmp_path: Path,
) -> None:
    topology = make_topology(["1h"])
    apply_topology(topology, rabbitmq_url)
    tier = topology.tier_name(topology.ladder.tiers[0])
    topology_file, out, db = tmp_path / "t.json", tmp_path / "confirmed", tmp_path / "index.db"
    topology_file.write_text(topology.model_dump_json())
    SQLiteSchedule(db).close()  # the file, so the test can read it at any time
    target = Target(
        [
            "--url", rabbitmq_url, "--topology", str(topology_file), "--index", str(db),
            "--out", str(out), "--adapter", adapter, "--kill", kill, "--batch", str(batch),
            "--count", str(10 * batch if batch > 1 else 100_000),
        ],
        tmp_path / "publisher.err",
        module="tests.integration.schedule_kill_target",
    )  # fmt: skip
    target.start()
    assert target.process is not None
    if kill == "none":
        if batch == 1:
            wait_for(lambda: len(lines(out)) >= 200, 60, "200 confirmed publishes")
        else:  # past the first batch, in one of the nine after it
            wait_for(lambda: depth(rabbitmq_url, tier) >= batch + 3_000, 120, "a batch sent")
        target.kill()
    else:
        target.process.wait(60)
    assert target.process.returncode == -9, (tmp_path / "publisher.err").read_text()[-2000:]

    confirmed = lines(out)
    broker = at_broker(rabbitmq_url, tier)
    index = SQLiteSchedule(db)
    try:
        every = index.find(Query(states=set(State)), limit=100_000)
        state = {e.id: e.state for e in every}
    finally:
        index.close()
    scheduled = {i for i, s in state.items() if s is State.SCHEDULED}
    assert set(confirmed) <= scheduled, "a publish that returned is not scheduled"
    assert scheduled <= broker, "an entry shows scheduled but its message is not at the broker"
    assert broker <= set(state), "a message at the broker has no entry"
    assert set(state.values()) <= {State.SCHEDULED, State.PENDING}
    pending = set(state) - scheduled
    if kill == "add:5":  # its 5th message recorded, never sent
        assert pending == {"s4"} and "s4" not in broker and len(confirmed) == 4
    elif kill == "move:5":  # its 5th message confirmed by the broker, not yet moved
        assert pending == {"s4"} and "s4" in broker and len(confirmed) == 4


@pytest.mark.parametrize("adapter", ["sync", "async"])
def test_a_consumer_killed_with_reports_queued_leaves_only_its_acked_messages_waiting(
    adapter: str,
    make_topology: Callable[..., Topology],
    rabbitmq_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The consumer side: a consumer (``tests/integration/kill_target.py``) whose reporter
    had not written yet (``interval`` an hour) is SIGKILLed mid-run; another takes over
    with a reporter writing every 100 ms. Every entry shown handled was handled; what is
    still shown scheduled is exactly what the killed consumer acked and never reported
    (the guide's stated limit), and ``delayq stats --index`` says the index shows more
    waiting than the tier holds."""
    import json
    import sqlite3

    from delayq import Message
    from delayq.cli import main
    from delayq.schedule.record import ScheduleIndex
    from delayq.sync import Publisher

    total = 300
    topology = make_topology(["1s"])
    queue = f"{topology.namespace}.work"
    db, started, index_db = tmp_path / "app.db", tmp_path / "started.log", tmp_path / "i.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE effects (n INTEGER, pid INTEGER)")
    conn.close()
    topology_file = tmp_path / "t.json"
    topology_file.write_text(topology.model_dump_json())
    index = SQLiteSchedule(index_db)
    apply_topology(topology, rabbitmq_url)
    with Publisher(rabbitmq_url, topology, schedule=ScheduleIndex(index)) as pub:
        pub.publish_many(
            [Message({"n": n}, "job.k", "1s", message_id=f"k{n}") for n in range(total)]
        )

    def effects() -> set[tuple[int, int]]:
        with sqlite3.connect(db) as c:
            found = {(int(n), int(p)) for n, p in c.execute("SELECT n, pid FROM effects")}
        c.close()
        return found

    common = ["--url", rabbitmq_url, "--topology", str(topology_file), "--queue", queue,
              "--db", str(db), "--started", str(started), "--adapter", adapter,
              "--schedule-index", str(index_db)]  # fmt: skip
    first = Target([*common, "--report-interval", "1h"], tmp_path / "first.err")
    first.start()
    wait_for(lambda: len(effects()) >= 100, 60, "100 handled by the first consumer")
    first.kill()
    second = Target([*common, "--report-interval", "100ms"], tmp_path / "second.err")
    second.start()
    try:
        wait_for(lambda: len({n for n, _ in effects()}) == total, 120, "every message handled")
        by_first = {f"k{n}" for n, p in effects() if p == first.pids[0]}

        def reported() -> bool:
            """Every message the second consumer handled shows past SCHEDULED (a count
            alone let one it handled a moment ago pass as one the first acked)."""
            shown = index.find(Query(states={State.SCHEDULED, State.DELIVERED}), limit=1_000)
            return all(e.state is State.SCHEDULED and e.id in by_first for e in shown)

        wait_for(reported, 30, "the second consumer's reports")
    finally:
        second.stop()
    state = {e.id: e.state for e in index.find(Query(states=set(State)), limit=1_000)}
    handled = {f"k{n}" for n, _ in effects()}
    assert set(state.values()) <= {State.SCHEDULED, State.HANDLED}
    assert {i for i, s in state.items() if s is State.HANDLED} <= handled
    waiting = {i for i, s in state.items() if s is State.SCHEDULED}
    assert waiting and waiting <= by_first, "only the killed consumer's acks stay unreported"
    index.close()
    (tmp_path / "t.yaml").write_text(topology_file.read_text())
    command = ["stats", "--url", rabbitmq_url, "-f", str(tmp_path / "t.yaml"),
               "--index", str(index_db), "--json"]  # fmt: skip
    assert main(command) == 0
    found = json.loads(capsys.readouterr().out)["index"]
    assert found["disagrees"] is True and found["tiers"][0]["unheld"] == len(waiting)
