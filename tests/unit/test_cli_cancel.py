"""`delayq cancel` and `delayq reschedule` (issue 15's CLI) on the memory broker: the
store named by `--store sqlite:///...`, shared with a consumer run in the test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from delayq import InvalidInput, SQLiteStore, Topology
from delayq.cli import EXIT_BROKER, EXIT_INPUT, EXIT_OK, main
from delayq.stores.base import ClaimStatus
from delayq.testing import MemoryBroker

TOPOLOGY_YAML = """\
namespace: shop
ladder: [1m, 30m]
destinations:
  - queue: orders
    bindings: [order.*]
  - queue: audit
    bindings: ["#"]
"""


@pytest.fixture
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The broker's URL is $DELAYQ_URL: `reschedule` publishes there, and `cancel`, which
    takes no --url (it marks the store only), must not mind it."""
    topo_file = tmp_path / "topology.yaml"
    topo_file.write_text(TOPOLOGY_YAML)
    db = tmp_path / "idem.db"
    store = SQLiteStore(db)
    with MemoryBroker() as broker:
        topology = Topology(
            namespace="shop",
            ladder=["1m", "30m"],
            destinations=[
                {"queue": "orders", "bindings": ["order.*"]},
                {"queue": "audit", "bindings": ["#"]},
            ],
        )
        broker.apply(topology)
        monkeypatch.setenv("DELAYQ_URL", broker.url)
        base = ["--file", str(topo_file), "--store", f"sqlite:///{db}"]
        yield broker, topology, store, base
    store.close()


def _json(capsys) -> dict:
    return json.loads(capsys.readouterr().out)


def test_cancel_by_id_stops_the_handler_and_unknown_is_exit_0(setup, capsys):
    broker, topology, store, base = setup
    handled: list = []
    broker.consumer(topology, "orders", handled.append, store=store)
    publisher = broker.publisher(topology)
    publisher.publish({"n": 1}, "order.autocancel", "30m", message_id="m-1")
    publisher.publish({"n": 2}, "order.autocancel", "30m", message_id="m-2")
    assert main(["cancel", "--message-id", "m-1", "--message-id", "never-sent", *base]) == EXIT_OK
    out = capsys.readouterr().out
    assert "message_id" in out and "m-1" in out and "orders=unknown audit=unknown" in out
    assert "never-sent" in out  # an unknown id is reported, not an error
    broker.advance("1h")
    assert handled == [{"n": 2}]


def test_cancel_json_and_already_cancelled(setup, capsys):
    *_, base = setup
    assert main(["cancel", "--key", "order-42", "--json", *base]) == EXIT_OK
    first = _json(capsys)
    assert first["receipts"][0]["key"] == "order-42"
    assert first["receipts"][0]["status"] == "unknown" and first["error"] is None
    assert main(["cancel", "--key", "order-42", "--json", *base]) == EXIT_OK
    again = _json(capsys)["receipts"][0]
    assert again["status"] == "already cancelled" and again["cancelled"] is True


def test_cancel_losing_the_race_exits_1_and_says_so(setup, capsys):
    *_, store, base = setup
    # a consumer holds a live claim on orders' copy: its handler runs now
    assert store.claim("q:orders:busy", lease_ms=10**14, now_ms=0) is ClaimStatus.CLAIMED
    code = main(["cancel", "--message-id", "busy", "--routing-key", "order.x", *base])
    captured = capsys.readouterr()
    assert code == EXIT_BROKER
    assert "in progress" in captured.out
    assert "lost the race" in captured.err


def test_cancel_from_a_file_of_ids_and_of_keys(setup, tmp_path, capsys):
    *_, base = setup
    ids = tmp_path / "ids.txt"
    ids.write_text("# to cancel\na-1\n\na-2\n")
    assert main(["cancel", "--from-file", str(ids), "--json", *base]) == EXIT_OK
    got = [r["message_id"] for r in _json(capsys)["receipts"]]
    assert got == ["a-1", "a-2"]
    assert main(["cancel", "--from-file", str(ids), "--file-has-keys", "--json", *base]) == 0
    assert [r["key"] for r in _json(capsys)["receipts"]] == ["a-1", "a-2"]


def test_a_store_failure_midway_prints_what_was_done(setup, capsys, monkeypatch):
    *_, base = setup
    from delayq.cli import cancel as cli_cancel
    from delayq.errors import StoreError
    from delayq.stores import base as stores_base

    monkeypatch.setattr(cli_cancel, "BATCH", 1)
    real = stores_base.run_cancels
    calls = []

    def flaky(store, ops):
        calls.append(ops)
        if len(calls) == 2:
            raise StoreError("database is locked")
        return real(store, ops)

    monkeypatch.setattr(stores_base, "run_cancels", flaky)  # imported by the command as it runs
    code = main(["cancel", "--message-id", "x-1", "--message-id", "x-2", "--json", *base])
    printed = capsys.readouterr()
    assert code == EXIT_BROKER
    doc = json.loads(printed.out)
    assert [r["message_id"] for r in doc["receipts"]] == ["x-1"]
    assert doc["not_done"] == ["x-2"] and "database is locked" in doc["error"]
    assert "after 1 message (shown); 1 message not cancelled" in printed.err


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ([], "one of --message-id or --key or --from-file is required"),
        (["--message-id", "a", "--key", "b"], "--key is not allowed with --message-id"),
        (["--message-id", "a", "--from-file", "f"], "--from-file is not allowed with"),
        (["--message-id", "a", "--file-has-keys"], "--file-has-keys goes with --from-file"),
        (["--from-file", "/no/such/file"], "cannot read --from-file"),
    ],
)
def test_cancel_misuse_exits_2(setup, extra, says, capsys):
    *_, base = setup
    assert main(["cancel", *extra, *base]) == EXIT_INPUT
    assert says in capsys.readouterr().err


@pytest.mark.parametrize(
    ("store", "says"),
    [
        ("mysql://x/y", "is not a store URL"),
        ("/tmp/idem.db", "is not a store URL"),
        ("sqlite:///no/such/idem.db", "no SQLite file"),
        ("sqlite://", "names no file"),
        ("redis://:bad:port:x/", "--store"),
    ],
)
def test_a_bad_store_url_exits_2(setup, store, says, capsys):
    *_, base = setup
    argv = ["cancel", "--message-id", "a", *base[:2], "--store", store]
    assert main(argv) == EXIT_INPUT
    assert says in capsys.readouterr().err


def test_reschedule_moves_the_message(setup, capsys):
    broker, topology, store, base = setup
    handled: list = []
    broker.consumer(topology, "orders", handled.append, store=store)
    broker.publisher(topology).publish({"n": 1}, "order.remind", "30m", message_id="r-1")
    argv = ["reschedule", "--message-id", "r-1", "--delay", "1m", "--body", '{"n": 2}']
    assert main([*argv, "-k", "order.remind", "--json", *base]) == EXIT_OK
    doc = _json(capsys)
    assert doc["moved"] is True and doc["message_id"] == "r-1" and doc["tier"] == "1m"
    assert doc["marks"]["queues"] == {"orders": "unknown", "audit": "unknown"}
    broker.advance("2m")
    assert handled == [{"n": 2}]
    broker.advance("1h")
    assert handled == [{"n": 2}]  # the old copy met its mark


def test_reschedule_due_at_and_text_output(setup, capsys):
    *_, base = setup
    argv = ["reschedule", "--key", "k-1", "--due-at", "2000-01-01T00:00:00Z", "--body", "1"]
    assert main([*argv, "-k", "order.x", *base]) == EXIT_OK
    out = capsys.readouterr().out
    assert "moved       True" in out and "tier        immediate" in out  # past: now


def test_reschedule_refused_after_a_cancel_exits_1(setup, capsys):
    *_, base = setup
    assert main(["cancel", "--message-id", "gone", *base]) == EXIT_OK
    capsys.readouterr()
    argv = ["reschedule", "--message-id", "gone", "-d", "1m", "--body", "1", "-k", "order.x"]
    assert main([*argv, *base]) == EXIT_BROKER
    captured = capsys.readouterr()
    assert "not rescheduled (already cancelled)" in captured.err
    assert "moved       False" in captured.out


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["-d", "1m", "--body", "1"], "one of --message-id or --key is required"),
        (["--message-id", "a", "--key", "b", "-d", "1m", "--body", "1"], "not allowed"),
        (["--message-id", "a", "-d", "90", "--body", "1"], "bare number"),
        (["--message-id", "a", "--body", "1"], "one of --delay or --due-at is required"),
        (["--message-id", "a", "-d", "1m"], "one of --body or --body-file is required"),
        (["--message-id", "a", "-d", "1m", "--body", "{"], "--body is not valid JSON"),
        (["--message-id", "a", "--due-at", "tomorrow", "--body", "1"], "not an ISO 8601"),
        (["--message-id", "a", "--due-at", "2030-01-01T00:00", "--body", "1"], "no time zone"),
        (["--message-id", "a", "-d", "1m", "--body", "1", "-k", "a b#"], "routing key"),
    ],
)
def test_reschedule_misuse_exits_2_and_marks_nothing(setup, extra, says, capsys):
    *_, base = setup
    routing = [] if "-k" in extra else ["-k", "order.x"]
    assert main(["reschedule", *extra, *routing, *base]) == EXIT_INPUT
    assert says in capsys.readouterr().err
    # nothing was marked: a cancel still finds the key unknown
    assert main(["cancel", "--message-id", "a", "--json", *base]) == EXIT_OK
    assert _json(capsys)["receipts"][0]["status"] == "unknown"


def test_cancel_needs_no_broker_and_reads_stdin(setup, monkeypatch, capsys):
    """A cancel only marks the store: a dead broker in $DELAYQ_URL does not stop it."""
    *_, base = setup
    import io

    monkeypatch.setenv("DELAYQ_URL", "amqp://guest:guest@127.0.0.1:1/")
    monkeypatch.setattr("sys.stdin", io.StringIO("s-1\ns-2\n"))
    assert main(["cancel", "--from-file", "-", "--json", *base]) == EXIT_OK
    assert [r["message_id"] for r in _json(capsys)["receipts"]] == ["s-1", "s-2"]


def test_an_empty_file_is_refused(setup, tmp_path, capsys):
    *_, base = setup
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing\n\n")
    assert main(["cancel", "--from-file", str(empty), *base]) == EXIT_INPUT
    assert "names no message" in capsys.readouterr().err


def test_an_unreachable_store_server_is_a_delayq_error_exit_1(setup, capsys):
    # Before: redis-py's ConnectionError escaped with its traceback.
    *_, base = setup
    argv = ["cancel", "--message-id", "a", *base[:2], "--store", "redis://u:pw@127.0.0.1:1/0"]
    assert main(argv) == EXIT_BROKER
    err = capsys.readouterr().err
    assert "delayq: error: cannot open the store at redis://u:***@127.0.0.1:1/0" in err
    assert "Traceback" not in err and "pw" not in err


def test_a_relative_sqlite_url_is_made_absolute_for_other_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from delayq.stores.url import absolute_store_url

    monkeypatch.chdir(tmp_path)
    SQLiteStore("idem.db").close()
    assert absolute_store_url("sqlite:///idem.db") == f"sqlite:///{tmp_path / 'idem.db'}"
    assert absolute_store_url("redis://h:1/0") == "redis://h:1/0"
    with pytest.raises(InvalidInput, match="no SQLite file"):
        absolute_store_url("sqlite:///typo.db")


def test_a_due_at_without_a_time_zone_is_refused_before_the_store_is_opened(
    setup, tmp_path, capsys
):
    *_, base = setup
    store = tmp_path / "not-yet.db"
    argv = ["reschedule", "--message-id", "a", "--due-at", "2030-01-01T00:00", "--body", "1"]
    at = base.index("--store")
    rest = [*base[:at], "--store", f"sqlite:///{store}", *base[at + 2 :]]
    assert main([*argv, "-k", "order.x", *rest]) == EXIT_INPUT
    assert "no time zone" in capsys.readouterr().err
    assert not store.exists()  # nothing opened, nothing created
