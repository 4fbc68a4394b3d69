"""`delayq scheduled list | count | show` (issue 51) over an index a publisher kept on the
memory broker: exact answers, every entry once across pages, and misuse refused with
nothing created."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

import pytest

from delayq import Message, Topology
from delayq.cli import EXIT_BROKER, EXIT_INPUT, EXIT_OK, main
from delayq.schedule.query import Query
from delayq.schedule.record import ScheduleIndex
from delayq.schedule.sqlite import SQLiteSchedule
from delayq.schedule.transfer import entry_line, read_lines
from delayq.testing import MemoryBroker
from delayq.topology.model import load_topology

TOPOLOGY_YAML = """\
namespace: shop
ladder: [1m, 30m, 1h]
destinations:
  - queue: orders
    bindings: [order.*]
  - queue: mail
    bindings: [mail.#]
"""


@pytest.fixture
def index(tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    """30 messages published through an index: 10 due in 1m (mail), 20 in 30m (orders),
    half of each tenant; one cancelled."""
    (tmp_path / "t.yaml").write_text(TOPOLOGY_YAML)
    db = tmp_path / "index.db"
    topology = Topology(
        namespace="shop",
        ladder=["1m", "30m", "1h"],
        destinations=[
            {"queue": "orders", "bindings": ["order.*"]},
            {"queue": "mail", "bindings": ["mail.#"]},
        ],
    )
    store = SQLiteSchedule(db)
    labels = lambda m: {"tenant": "a" if m.message_id.endswith(("0", "2", "4", "6", "8")) else "b"}  # noqa: E731
    ids: dict[str, str] = {}
    with MemoryBroker() as broker:
        broker.apply(topology)
        from delayq.stores.memory import InMemoryStore

        with broker.publisher(
            topology,
            schedule=ScheduleIndex(store, labels=labels),
            store=InMemoryStore(),
            clock_ms=lambda: time.time_ns() // 1_000_000,  # the CLI's clock, not the broker's
        ) as pub:
            pub.publish_many(
                [Message(n, "mail.welcome", "1m", message_id=f"m{n}") for n in range(10)]
            )
            pub.publish_many(
                [Message(n, "order.remind", "25m", message_id=f"o{n}") for n in range(20)]
            )
            pub.publish("late", "order.remind", "0s")  # immediate: not in the index
            pub.cancel(message_id="o19")
    store.close()
    base = ["--file", str(tmp_path / "t.yaml"), "--index", str(db)]
    ids["db"] = str(db)
    return base, ids


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any]:
    code = main(list(argv))
    out = capsys.readouterr().out
    try:
        return code, json.loads(out)
    except json.JSONDecodeError:
        return code, out


def test_counts_are_exact_for_each_filter(index, capsys) -> None:
    base, _ = index
    assert run(capsys, "scheduled", "count", *base) == (EXIT_OK, 29)
    assert run(capsys, "scheduled", "count", *base, "--due-before", "5m") == (EXIT_OK, 10)
    assert run(capsys, "scheduled", "count", *base, "--due-after", "5m") == (EXIT_OK, 19)
    assert run(capsys, "scheduled", "count", *base, "-k", "order.#") == (EXIT_OK, 19)
    assert run(capsys, "scheduled", "count", *base, "--destination", "mail") == (EXIT_OK, 10)
    assert run(capsys, "scheduled", "count", *base, "--label", "tenant=a") == (EXIT_OK, 15)
    assert run(capsys, "scheduled", "count", *base, "--state", "cancelled") == (EXIT_OK, 1)
    assert run(capsys, "scheduled", "count", *base, "--state", "all") == (EXIT_OK, 30)
    assert run(capsys, "scheduled", "count", *base, "--json") == (EXIT_OK, {"count": 29})


def test_list_pages_every_entry_once_soonest_first(index, capsys) -> None:
    base, _ = index
    seen: list[dict[str, Any]] = []
    after: list[str] = []
    while True:
        code, page = run(capsys, "scheduled", "list", *base, "--limit", "7", "--json", *after)
        assert code == EXIT_OK
        seen += page["entries"]
        if page["next"] is None:
            break
        after = ["--after", page["next"]]
    assert len(seen) == 29 and len({e["id"] for e in seen}) == 29
    assert [e["due_at_ms"] for e in seen] == sorted(e["due_at_ms"] for e in seen)
    assert {e["id"] for e in seen[:10]} == {f"m{n}" for n in range(10)}
    assert seen[0]["destinations"] == ["mail"] and seen[0]["tier"] == "1m"
    code, text = run(capsys, "scheduled", "list", *base, "--limit", "2")
    assert code == EXIT_OK and "# more: --after " in text and text.count("scheduled") == 2


def test_show_prints_one_entry_and_says_when_there_is_none(index, capsys) -> None:
    _, ids = index
    code, shown = run(
        capsys, "scheduled", "show", "--index", ids["db"], "--message-id", "o19", "--json"
    )
    assert code == EXIT_OK and shown["entry"]["state"] == "cancelled"
    assert shown["entry"]["labels"] == {"tenant": "b"}
    assert (
        run(capsys, "scheduled", "show", "--index", ids["db"], "--message-id", "zz")[0]
        == EXIT_BROKER
    )


@pytest.mark.parametrize(
    "extra",
    [
        ["--state", "waiting"],
        ["--label", "tenant"],
        ["--due-before", "10"],
        ["--after", "soon"],
        ["--limit", "0"],
        ["--limit", "99999999999999999999"],
        ["--after", "99999999999999999999999:m1"],
        ["--after", "\uff11\uff12\uff13:m1"],  # full-width digits
        ["--label", "tenant=a", "--label", "tenant=b"],  # one value per label: refused
        ["-k", " "],
    ],
)
def test_bad_options_are_input_errors(index, capsys, extra: list[str]) -> None:
    base, _ = index
    assert main(["scheduled", "list", *base, *extra]) == EXIT_INPUT


def test_an_index_that_is_not_there_is_not_made(tmp_path: Path, index, capsys) -> None:
    base, _ = index
    missing = tmp_path / "nowhere" / "index.db"
    assert main(["scheduled", "count", *base[:2], "--index", str(missing)]) == EXIT_BROKER
    assert "no schedule index" in capsys.readouterr().err
    assert not missing.parent.exists()
    assert main(["scheduled", "count", *base[:2], "--index", "mysql://host"]) == EXIT_INPUT
    assert main(["scheduled", "count", *base[:2], "--index", "redis://127.0.0.1:1/0"]) == 1


@pytest.fixture
def live(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A memory broker with a consumer on orders (idempotency store in SQLite, shared with
    the CLI's --store), 10 orders published through a SQLite index with bodies kept."""
    (tmp_path / "t.yaml").write_text(TOPOLOGY_YAML)
    from delayq import SQLiteStore

    db, idem = tmp_path / "index.db", tmp_path / "idem.db"
    topology = Topology(
        namespace="shop",
        ladder=["1m", "30m", "1h"],
        destinations=[
            {"queue": "orders", "bindings": ["order.*"]},
            {"queue": "mail", "bindings": ["mail.#"]},
        ],
    )
    index, store, handled = SQLiteSchedule(db), SQLiteStore(idem), []
    with MemoryBroker() as broker:
        broker.apply(topology)
        monkeypatch.setenv("DELAYQ_URL", broker.url)
        broker.consumer(topology, "orders", handled.append, store=store)
        labels = lambda m: {"tenant": m.headers["tenant"]}  # noqa: E731
        with broker.publisher(
            topology, store=store, schedule=ScheduleIndex(index, labels=labels, keep_bodies=99)
        ) as pub:
            pub.publish_many(
                [
                    Message(n, "order.remind", "25m", message_id=f"o{n}", headers={"tenant": t})
                    for n, t in enumerate(["a", "b"] * 5)
                ]
            )
        base = [
            "--file",
            str(tmp_path / "t.yaml"),
            "--index",
            str(db),
            "--store",
            f"sqlite:///{idem}",
        ]
        yield broker, handled, base, index
    index.close()
    store.close()


def test_purge_promote_and_reschedule_from_the_command_line(live, capsys) -> None:
    broker, handled, base, index = live
    assert main(["scheduled", "purge", *base]) == EXIT_INPUT  # no filter, no --all
    code, counts = run(capsys, "scheduled", "purge", *base, "--label", "tenant=b", "--json")
    assert code == EXIT_OK and counts == {"matched": 5, "cancelled": 5, "not_cancelled": 0}
    code, moved = run(capsys, "scheduled", "promote", *base, "--message-id", "o0", "--json")
    assert code == EXIT_OK and moved["receipts"][0]["moved"]
    code, _ = run(capsys, "scheduled", "reschedule", *base, "--message-id", "o2", "-d", "50m")
    assert code == EXIT_OK
    assert (
        main(["scheduled", "reschedule", *base, "--message-id", "nope", "-d", "5m"]) == EXIT_INPUT
    )
    broker.advance("1s")
    assert handled == [0]
    broker.advance("30m")
    assert sorted(handled) == [0, 4, 6, 8]
    broker.advance("30m")
    assert sorted(handled) == [0, 2, 4, 6, 8]  # the odd ones (tenant b) never
    assert index.get("o2").state.value == "rescheduled"  # type: ignore[union-attr]


def test_cancel_by_id_and_expire_from_the_command_line(live, capsys) -> None:
    broker, handled, base, index = live
    code, got = run(
        capsys, "scheduled", "cancel", *base, "--message-id", "o1", "--message-id", "o3", "--json"
    )
    assert code == EXIT_OK
    assert got["cancelled"] == 2 and [r["message_id"] for r in got["receipts"]] == ["o1", "o3"]
    assert index.get("o1").state.value == "cancelled"  # type: ignore[union-attr]
    code, got = run(capsys, "scheduled", "cancel", *base, "--message-id", "o1", "--json")
    assert code == EXIT_OK and got["receipts"][0]["status"] == "already cancelled"
    # an id not in the index: nothing is cancelled, exit 2
    assert main(["scheduled", "cancel", *base, "--message-id", "o5", "--message-id", "x"]) == 2
    assert index.get("o5").state.value == "scheduled"  # type: ignore[union-attr]
    broker.advance("30m")
    assert sorted(handled) == [0, 2, 4, 5, 6, 7, 8, 9]
    expire = ["scheduled", "expire", "--index", base[3]]
    assert main([*expire, "--older-than", "10"]) == EXIT_INPUT  # no unit
    assert main([*expire, "--older-than", "-1h"]) == EXIT_INPUT
    code, got = run(capsys, *expire, "--older-than", "36500d", "--json")
    assert code == EXIT_OK and got == {"deleted": 0}  # the cancels are newer than that
    code, got = run(capsys, *expire, "--older-than", "0s", "--json")
    assert code == EXIT_OK and got == {"deleted": 2}  # handled ones stay: no reporter here
    assert index.get("o1") is None and index.get("o0") is not None


def test_export_then_import_into_another_namespace_keeps_ids_and_due_times(
    live, capsys, tmp_path: Path
) -> None:
    broker, _, base, _ = live
    out = tmp_path / "export.jsonl"
    cli_index = base[:4]  # --file, --index
    assert (
        main(["scheduled", "export", *cli_index, "--label", "tenant=a", "-o", str(out)]) == EXIT_OK
    )
    lines = out.read_text().splitlines()
    assert len(lines) == 5 and all(json.loads(line)["body"] for line in lines)
    target = tmp_path / "t2.yaml"
    target.write_text(TOPOLOGY_YAML.replace("namespace: shop", "namespace: shop2"))
    broker.apply(
        Topology(namespace="shop2", ladder=["1m", "30m", "1h"],
                 destinations=[{"queue": "orders2", "bindings": ["order.*"]},
                               {"queue": "mail2", "bindings": ["mail.#"]}])
    )  # fmt: skip
    moved: list[int] = []
    broker.consumer(
        Topology(namespace="shop2", ladder=["1m", "30m", "1h"],
                 destinations=[{"queue": "orders2", "bindings": ["order.*"]},
                               {"queue": "mail2", "bindings": ["mail.#"]}]),
        "orders2", moved.append,
    )  # fmt: skip
    index2 = tmp_path / "index2.db"
    code, counts = run(
        capsys, "scheduled", "import", "--file", str(target), "-i", str(out),
        "--index", str(index2), "--json",
    )  # fmt: skip
    assert code == EXIT_OK and counts == {"published": 5, "not_kept": [], "skipped": 0}
    older = {k: v for k, v in json.loads(lines[0]).items() if k != "delay_ms"}
    (read,) = read_lines([json.dumps(older)])  # an older delayq's line: no delay_ms
    assert read.id == older["id"] and read.delay_ms is None
    copied = SQLiteSchedule(index2)
    try:
        for line in lines:
            was = json.loads(line)
            now = copied.get(was["id"])
            assert now is not None and now.namespace == "shop2"
            assert dict(now.labels) == {"tenant": "a"}
            # due in the smallest tier at or above what was left: never earlier
            assert was["due_at_ms"] <= now.due_at_ms <= was["due_at_ms"] + 30 * 60_000
    finally:
        copied.close()
    broker.advance("2h")
    assert sorted(moved) == [0, 2, 4, 6, 8]


@pytest.mark.parametrize(
    "text, error",
    [
        ("not json\n", "line 2: not JSON"),
        ('{"format": "other"}\n', "line 2: not a line of delayq scheduled export"),
        ('\n{"format": "delayq.schedule/1", "id": "x"}\n', "line 3: no 'namespace', 'routing"),
        ("state=waiting", "line 2: state 'waiting' is none of pending, scheduled"),
        ("body=%%", "line 2: body is not base64 text"),
        ("destinations=q", "line 2: destinations is a list of queues, not 'q'"),
        (None, "kept body is not what its content type"),
        ("type=application/x-weird", "content type 'application/x-weird' is not one"),
        ("due_at_ms=" + str(10**30), "line 2: an entry's due_at_ms is an int from 0"),
        ("delay_ms=soon", "line 2: an entry's delay_ms is None or an int from 0"),
    ],
)
def test_a_bad_export_line_is_refused_before_anything_is_published(
    live, capsys, tmp_path: Path, text: str, error: str
) -> None:
    broker, _, base, index = live
    bad = tmp_path / "bad.jsonl"
    good = json.loads(entry_line(index.get("o1")))
    if text is None:  # a JSON content type over a body that is not JSON
        good["body"] = base64.b64encode(b"{not json").decode()
        text = json.dumps(good) + "\n"
    elif text.startswith("type="):
        good["content_type"] = text[5:]
        text = json.dumps(good) + "\n"
    elif "=" in text:  # one field changed
        name, _, value = text.partition("=")
        good[name] = int(value) if value.isdigit() else value
        text = json.dumps(good) + "\n"
    bad.write_text(entry_line(index.get("o3")) + "\n" + text)  # a good line first
    before = {q: broker.depth(q) for q in broker.queues()}
    assert main(["scheduled", "import", base[0], base[1], "-i", str(bad)]) == EXIT_INPUT
    assert error in capsys.readouterr().err
    assert {q: broker.depth(q) for q in broker.queues()} == before  # nothing was sent


def test_an_import_of_entries_whose_bodies_were_not_kept_sends_none_and_says_so(
    index, capsys, tmp_path: Path
) -> None:
    base, _ = index
    out = tmp_path / "export.jsonl"
    assert main(["scheduled", "export", *base, "--state", "all", "-o", str(out)]) == EXIT_OK
    assert "exported 30 entries" in capsys.readouterr().err
    code, counts = run(capsys, "scheduled", "import", base[0], base[1], "-i", str(out), "--json")
    assert code == EXIT_BROKER and counts["published"] == 0 and len(counts["not_kept"]) == 29
    assert counts["skipped"] == 1  # the cancelled one: no longer waiting


def test_a_database_that_is_not_an_index_is_refused_and_left_as_it_was(
    index, tmp_path: Path, capsys
) -> None:
    import sqlite3

    base, _ = index
    other = tmp_path / "idem.db"  # the consumers' store given by mistake, say
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE delayq_idempotency (key TEXT PRIMARY KEY)")
    db.close()
    assert main(["scheduled", "count", *base[:2], "--index", str(other)]) == EXIT_INPUT
    assert "not a schedule index: is it the consumers' store" in capsys.readouterr().err
    with sqlite3.connect(other) as db:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
    db.close()
    assert tables == {"delayq_idempotency", "sqlite_autoindex_delayq_idempotency_1"}
    assert main(["scheduled", "count", *base[:2], "--index", str(tmp_path)]) == EXIT_BROKER
    assert "a directory" in capsys.readouterr().err


def test_an_import_into_the_index_its_source_still_waits_in_is_refused(
    live, capsys, tmp_path: Path
) -> None:
    """One entry per id in an index: importing namespace shop's export into shop2 with
    the same index, the source's entries still live, would record nothing for shop2."""
    broker, _, base, index = live
    out = tmp_path / "export.jsonl"
    assert main(["scheduled", "export", *base[:4], "-o", str(out)]) == EXIT_OK
    other = tmp_path / "t2.yaml"
    other.write_text(TOPOLOGY_YAML.replace("namespace: shop", "namespace: shop2"))
    broker.apply(load_topology(other))
    capsys.readouterr()
    command = ["scheduled", "import", "--file", str(other), "--index", base[3], "-i", str(out)]
    assert main(command) == EXIT_INPUT
    assert "waits in namespace 'shop' of this index" in capsys.readouterr().err
    assert index.count(Query(namespace="shop2")) == 0


def test_an_index_is_made_only_in_a_folder_that_is_there_and_never_by_a_replay(
    tmp_path: Path,
) -> None:
    from delayq.errors import InvalidInput, StoreError
    from delayq.schedule.url import open_index

    with pytest.raises(InvalidInput, match=r"no folder .* make it first"):
        open_index(str(tmp_path / "typo" / "x.db"), create=True)
    assert not (tmp_path / "typo").exists()
    empty = tmp_path / "empty.db"
    empty.touch()
    with pytest.raises(StoreError, match="an empty file"):
        open_index(str(empty), made=True)
    assert empty.stat().st_size == 0
    open_index(str(empty), create=True).close()  # a writer that makes indexes may
    open_index(str(empty), made=True).close()  # and then it is one
