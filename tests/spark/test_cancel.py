"""delayq.spark.cancel_from_dataframe and ``delayq spark cancel``: marks made by Spark
tasks, each opening the consumers' store from its URL (SQLite shared by local executors,
Redis), read back by claims and by a real consumer on a real broker."""

from __future__ import annotations

import json
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from delayq import InvalidInput, RowsRejected, SparkJobFailed, SQLiteStore, StoreError, Topology
from delayq.cli import main
from delayq.message.bulk import key_message_id
from delayq.spark import cancel_from_dataframe, schedule
from delayq.stores.base import ClaimStatus
from delayq.stores.key_scope import KeyScope, scoped_key
from delayq.sync import Consumer, apply_topology
from tests.waiting import wait_for

NOW_MS = 1_700_000_000_000
LEASE_MS = 10 * 365 * 86_400_000  # a claim live whatever the job's clock says


def two_queues(namespace: str = "spc") -> Topology:
    return Topology(
        namespace=namespace,
        ladder=["1m"],
        destinations=[
            {"queue": "a", "bindings": ["job.#"]},
            {"queue": "b", "bindings": ["job.x"]},
        ],
    )


def claim(store: Any, identity: str, queue: str) -> ClaimStatus:
    """A consumer's claim of ``identity`` in ``queue`` (just after the test's claims)."""
    key = scoped_key(identity, queue, KeyScope.QUEUE)
    return store.claim(key, lease_ms=1000, now_ms=NOW_MS + 1)  # type: ignore[no-any-return]


def errors_in(path: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line) for part in path.glob("part-*") for line in part.read_text().splitlines()
    ]


def test_ids_are_marked_in_a_sqlite_file_the_executors_share_each_answer_counted(
    spark: Any, tmp_path: Path
) -> None:
    topology = two_queues()
    db = tmp_path / "keys.db"
    store = SQLiteStore(db)
    try:
        q = KeyScope.QUEUE
        store.claim(scoped_key("m-done", "a", q), lease_ms=1000, now_ms=NOW_MS)
        store.complete(scoped_key("m-done", "a", q), now_ms=NOW_MS)
        store.claim(scoped_key("m-busy", "b", q), lease_ms=LEASE_MS, now_ms=NOW_MS)
        store.claim(scoped_key("m-lapsed", "a", q), lease_ms=1, now_ms=NOW_MS)  # lease over
        store.cancel(scoped_key("m-again", "a", q), now_ms=NOW_MS)
        store.cancel(scoped_key("m-again", "b", q), now_ms=NOW_MS)
        ids = [f"m{n}" for n in range(1100)]  # two tasks, two batches (of 500) each
        rows = [(i,) for i in [*ids, "m-done", "m-busy", "m-lapsed", "m-again", None, "", " "]]
        df = spark.createDataFrame(rows, "id string").repartition(2)
        progress: list[tuple[int, int]] = []
        summary = cancel_from_dataframe(
            df,
            topology,
            f"sqlite:///{db}",
            id_column="id",
            errors_path=str(tmp_path / "errors"),
            progress=lambda done, total: progress.append((done, total)),
            max_rejected=3,
        )
        assert summary.statuses == {
            "unknown": 1100,
            "already handled": 1,
            "in progress": 1,
            "cancelled": 1,
            "already cancelled": 1,
        }
        assert (summary.cancelled, summary.not_cancelled, summary.rejected) == (1102, 2, 3)
        assert summary.errors == {"InvalidMessageId": 3}
        assert progress
        reasons = {e.get("message_id"): e["reason"] for e in errors_in(tmp_path / "errors")}
        assert reasons == {
            None: "the message id is null",
            "": "the message id is empty (or blank)",
            " ": "the message id is empty (or blank)",
        }
        shown = summary.render()
        assert "NOT cancelled: 2" in shown and "rejected: 3 InvalidMessageId" in shown
        # Every queue of the topology is marked: a claim meets the mark.
        for identity in ("m0", "m1099", "m-lapsed"):
            assert claim(store, identity, "a") is ClaimStatus.CANCELLED
            assert claim(store, identity, "b") is ClaimStatus.CANCELLED
        assert claim(store, "m-done", "a") is ClaimStatus.DONE  # the lost race changed nothing
        assert claim(store, "m-busy", "b") is ClaimStatus.BUSY

    finally:
        store.close()


def test_a_routing_key_column_marks_only_the_queues_it_reaches(spark: Any, tmp_path: Path) -> None:
    topology = two_queues()
    db = tmp_path / "keys.db"
    store = SQLiteStore(db)
    try:
        rows = [("r1", "job.y"), ("r2", "job.x"), ("r3", "nope"), ("r4", None)]
        df = spark.createDataFrame(rows, "id string, kind string")
        # max_rejected=0: the rejected rows fail the job once the others are marked
        with pytest.raises(RowsRejected, match=r"2 of 4 rows were rejected") as raised:
            cancel_from_dataframe(
                df, topology, f"sqlite:///{db}", id_column="id", routing_key_column="kind"
            )
        summary = raised.value.summary
        assert summary.statuses == {"unknown": 2}
        by_id = {r["message_id"]: r for r in summary.rejections}
        assert by_id["r3"]["error"] == "UnboundRoutingKey"
        assert "reaches no destination" in by_id["r3"]["reason"]
        assert by_id["r4"]["error"] == "InvalidRoutingKey"
        assert claim(store, "r1", "a") is ClaimStatus.CANCELLED
        assert claim(store, "r1", "b") is ClaimStatus.CLAIMED  # job.y does not reach b
        assert claim(store, "r2", "b") is ClaimStatus.CANCELLED
        assert claim(store, "r3", "a") is ClaimStatus.CLAIMED
    finally:
        store.close()


def _topology_file(topology: Topology, tmp_path: Path) -> Path:
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(topology.model_dump(mode="json")))
    return path


def test_keys_of_a_bulk_scheduled_run_half_cancelled_by_the_cli_only_the_rest_handled(
    spark: Any,
    rabbitmq_url: str,
    make_topology: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    topology = make_topology()
    apply_topology(topology, rabbitmq_url)
    queue = f"{topology.namespace}.work"
    rows = [(f"order-{n}", "job.a", "2s", json.dumps({"n": n})) for n in range(40)]
    df = spark.createDataFrame(rows, "key string, routing_key string, delay string, body string")
    scheduled = schedule(df, url=rabbitmq_url, topology=topology, delay_col="delay", body_json=True)
    assert scheduled.total_published == 40
    cancelled = {f"order-{n}" for n in range(0, 40, 2)}
    source = tmp_path / "cancel.jsonl"
    source.write_text("".join(json.dumps({"order": k}) + "\n" for k in sorted(cancelled)))
    db = tmp_path / "keys.db"
    SQLiteStore(db).close()  # the consumers' store, empty: nothing delivered yet

    code = main(
        [
            "spark",
            "cancel",
            str(source),
            "--file",
            str(_topology_file(topology, tmp_path)),
            "--store",
            f"sqlite:///{db}",
            "--key-column",
            "order",
            "--json",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "cancelling (Spark tasks done): " in err
    result = json.loads(out)
    assert result["statuses"]["unknown"] == 20 and result["cancelled"] == 20
    assert (result["by"], result["rejected"], result["not_cancelled"]) == ("keys", 0, 0)

    store = SQLiteStore(db)
    handled: list[int] = []
    lock = threading.Lock()

    def handle(body: Any) -> None:
        with lock:
            handled.append(body["n"])

    consumer = Consumer(rabbitmq_url, topology, queue, handle, store=store)
    thread = threading.Thread(target=consumer.run, kwargs={"install_signal_handlers": False})
    thread.start()
    try:
        wait_for(
            lambda: consumer.stats.handled + consumer.stats.cancelled >= 40,
            60,
            lambda: f"40 deliveries settled, got {consumer.stats}",
        )
    finally:
        consumer.request_stop()
        thread.join(30)
        store.close()
    assert sorted(handled) == list(range(1, 40, 2))  # exactly the half not cancelled, once
    assert (consumer.stats.handled, consumer.stats.cancelled) == (20, 20)
    assert consumer.stats.duplicates == consumer.stats.dead_lettered == 0
    # The derived id was marked, as Publisher.cancel(key=...) marks it
    store = SQLiteStore(db)
    try:
        derived = key_message_id(topology.namespace, "order-0")
        assert claim(store, derived, queue) is ClaimStatus.CANCELLED
    finally:
        store.close()


def test_cli_misuse_is_refused_with_a_delayq_error_and_no_java_traceback(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    topo = _topology_file(two_queues(), tmp_path)
    source = tmp_path / "ids.jsonl"
    rows = [{"id": "a1"}, {"id": None}, {"other": 1}, {"id": "a2"}]
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    db = tmp_path / "keys.db"
    done = SQLiteStore(db)  # a1 was handled in queue a: its cancel comes too late
    done.claim(scoped_key("a1", "a", KeyScope.QUEUE), lease_ms=1000, now_ms=NOW_MS)
    done.complete(scoped_key("a1", "a", KeyScope.QUEUE), now_ms=NOW_MS)
    done.close()
    base = ["spark", "cancel", str(source), "--file", str(topo)]
    store = ["--store", f"sqlite:///{db}"]

    def run(*extra: str) -> tuple[int, str, str]:
        code = main([*base, *extra])
        out, err = capsys.readouterr()
        assert "Traceback" not in err and "java." not in err and "Py4J" not in err, err
        return code, out, err

    code, _, err = run(*store)
    assert code == 2 and "one of --id-column or --key-column is required" in err
    code, _, err = run(*store, "--id-col", "id", "--key-col", "id")
    assert code == 2 and "--key-column is not allowed with --id-column" in err
    code, _, err = run("--store", "memory://x", "--id-col", "id")
    assert code == 2 and "a store in one process's memory" in err
    code, _, err = run("--store", "sqlite:///:memory:", "--id-col", "id")
    assert code == 2 and "a store in one process's memory" in err
    code, _, err = run("--store", "redis://127.0.0.1:1/0", "--id-col", "id")
    assert code == 1 and "delayq: error: cannot open the store at redis://127.0.0.1:1/0" in err
    code, _, err = run("--store", f"sqlite:///{tmp_path / 'typo.db'}", "--id-col", "id")
    assert code == 2 and "no SQLite file at" in err
    code, _, err = run(*store, "--id-col", "nope")
    assert code == 2 and "the input has no column 'nope'; its columns: id, other" in err
    # null ids: answered rows counted, the rejected ones shown with their reason, exit 1
    code, out, err = run(*store, "--id-column", "id")
    assert code == 1, err
    assert "unknown          1" in out and "rejected: 2 InvalidMessageId" in out
    assert "already handled          1" in out and "NOT cancelled: 1" in out
    assert "rejected None: InvalidMessageId: the message id is null" in out
    assert "delayq: error: 2 of 4 rows were rejected (2 InvalidMessageId)" in err
    # a lost race is an answer, not an error: exit 0, and a warning that it was not cancelled
    code, out, err = run(*store, "--id-column", "id", "--allow-rejected", "--json")
    assert code == 0, err
    assert "delayq: warning: 1 message was NOT cancelled" in err
    doc = json.loads(out)
    assert doc["statuses"]["already cancelled"] == 1 and doc["statuses"]["already handled"] == 1
    assert (doc["cancelled"], doc["not_cancelled"], doc["rejected"]) == (1, 1, 2)


def test_library_misuse_is_refused_before_any_task(spark: Any, tmp_path: Path) -> None:
    topology = two_queues()
    db = tmp_path / "keys.db"
    SQLiteStore(db).close()
    url = f"sqlite:///{db}"
    df = spark.createDataFrame([("a", 1.5)], "id string, score double")
    with pytest.raises(InvalidInput, match="exactly one of id_column"):
        cancel_from_dataframe(df, topology, url)
    with pytest.raises(InvalidInput, match="exactly one of id_column"):
        cancel_from_dataframe(df, topology, url, id_column="id", key_column="id")
    with pytest.raises(InvalidInput, match="no column 'key'"):
        cancel_from_dataframe(df, topology, url, key_column="key")
    with pytest.raises(InvalidInput, match="column 'score' is double"):
        cancel_from_dataframe(df, topology, url, id_column="score")
    with pytest.raises(InvalidInput, match="cannot be sent to Spark's executors"):
        cancel_from_dataframe(df, topology, SQLiteStore(db), id_column="id")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="one process's memory"):
        cancel_from_dataframe(df, topology, "memory://", id_column="id")
    with pytest.raises(StoreError, match=r"cannot open the store at redis://127\.0\.0\.1:1"):
        cancel_from_dataframe(df, topology, "redis://127.0.0.1:1", id_column="id")
    with pytest.raises(InvalidInput, match="reaches no destination"):
        cancel_from_dataframe(df, Topology(namespace="empty", ladder=["1m"]), url, id_column="id")


@pytest.mark.parametrize("server", ["redis_url", "postgres_dsn"])
def test_whole_number_keys_derive_the_ids_bulk_scheduling_gave_them_on_a_server_store(
    spark: Any, server: str, request: pytest.FixtureRequest
) -> None:
    from delayq.stores.url import open_store

    url = request.getfixturevalue(server)
    topology = two_queues(f"spc{uuid.uuid4().hex[:8]}")  # a server shared by the session
    store = open_store(url)
    try:
        key = "4242"  # scheduled from an integer column: the job cast it to this text
        derived = key_message_id(topology.namespace, key)
        # a claim whose lease ran out long ago (its record lives on: Redis keeps it for
        # lease_ms)
        store.claim(scoped_key(derived, "a", KeyScope.QUEUE), lease_ms=60_000, now_ms=1)
        df = spark.createDataFrame([(4242,), (4243,)], "k long")
        summary = cancel_from_dataframe(df, topology, url, key_column="k")
        # 4242: known in a (its lease ran out), so cancelled; 4243 unknown everywhere
        assert summary.statuses == {"cancelled": 1, "unknown": 1}
        assert claim(store, derived, "a") is ClaimStatus.CANCELLED
        assert claim(store, derived, "b") is ClaimStatus.CANCELLED
        other = key_message_id(topology.namespace, "4243")
        assert claim(store, other, "b") is ClaimStatus.CANCELLED
    finally:
        store.close()


def test_a_task_s_store_error_is_raised_again_saying_what_stays_marked() -> None:
    from delayq.spark._checks import task_error

    text = (
        "An exception was thrown from the Python worker: Traceback (most recent call last):\n"
        "delayq.errors.StoreError: idempotency store RedisStore('redis://h:6379/0') failed: "
        "ConnectionError: connection lost\n"
    )
    note = " (raised in a Spark task; the marks made before it stay)"
    error = task_error(RuntimeError(text), note=note)
    assert isinstance(error, StoreError)
    assert str(error).endswith("ConnectionError: connection lost" + note)


def test_a_cancel_job_spark_fails_is_one_line_saying_the_marks_made_stay(
    spark: Any, tmp_path: Path
) -> None:
    from pyspark.sql import functions as F

    def key(n: int) -> str:
        if n == 7:
            raise RuntimeError("a user's UDF fails on row 7")
        return f"k{n}"

    df = spark.range(10).select(F.udf(key, "string")(F.col("id")).alias("key"))
    SQLiteStore(tmp_path / "keys.db").close()
    with pytest.raises(SparkJobFailed) as caught:
        cancel_from_dataframe(
            df, two_queues(), f"sqlite:///{tmp_path / 'keys.db'}", key_column="key"
        )
    message = str(caught.value)
    assert "the Spark job failed: RuntimeError: a user's UDF fails on row 7" in message
    assert "The marks made before it stay" in message and "\n" not in message
