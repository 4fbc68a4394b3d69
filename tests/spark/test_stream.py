"""delayq.spark.schedule_stream and ``delayq spark stream``: Structured Streaming sources
(rate and file) scheduled against a real broker, a query killed and restarted with its
checkpoint, a batch left unconfirmed failing the query, and the misuse refused."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from delayq import ConnectionFailed, InvalidInput, TopologyMissing
from delayq.aio import AsyncConsumer
from delayq.cli import main
from delayq.message.bulk import key_message_id
from delayq.spark import schedule, schedule_stream
from delayq.stores.memory import InMemoryStore
from delayq.sync import apply_topology, delete_topology
from tests.amqp import depth
from tests.spark.outputs import read_errors
from tests.spark.test_schedule import Running, Seen
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = "key string, routing_key string, delay string, body string"


def drop_csv(folder: Path, name: str, numbers: range) -> None:
    """A CSV file of rows ``n`` in ``numbers`` (bodies ``{"n": n}`` as Python's csv writes
    them), written beside ``folder`` and moved in whole: the file source sees it once."""
    text = io.StringIO()
    writer = csv.writer(text)
    writer.writerow(["key", "routing_key", "delay", "body"])
    for n in numbers:
        writer.writerow([f"row-{n}", "job.a", "0s" if n % 2 else "1s", json.dumps({"n": n})])
    staged = folder.parent / f".{name}"
    staged.write_text(text.getvalue())
    staged.rename(folder / name)


def commits(checkpoint: Path) -> set[int]:
    """The batches the query committed (its checkpoint's commit log)."""
    folder = checkpoint / "commits"
    return {int(p.name) for p in folder.glob("*") if p.name.isdigit()} if folder.exists() else set()


@pytest.fixture(autouse=True)
def no_query_left(spark: Any) -> Iterator[None]:
    """A test that failed with its query running leaves it to no other test."""
    yield
    for query in spark.streams.active:
        query.stop()


@pytest.fixture
def topo_file(rabbitmq_url: str, make_topology: Any, tmp_path: Path) -> tuple[Any, Path]:
    topology = make_topology()
    apply_topology(topology, rabbitmq_url)
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(topology.model_dump(mode="json")))
    return topology, path


def stream_args(tmp_path: Path, topo: Path, url: str, *extra: str) -> list[str]:
    return [
        "spark", "stream", "--input", str(tmp_path / "in"), "--format", "csv",
        "--schema", SCHEMA, "--option", 'escape="', "--body-json", "--delay-col", "delay",
        "--checkpoint", str(tmp_path / "checkpoint"), "--errors", str(tmp_path / "errors"),
        "--file", str(topo), "--url", url, *extra,
    ]  # fmt: skip


def test_rate_source_rows_reach_the_broker_each_with_its_key_s_id(
    spark: Any, rabbitmq_url: str, make_topology: Any, tmp_path: Path
) -> None:
    from pyspark.sql import functions as F

    topology = make_topology()
    apply_topology(topology, rabbitmq_url)
    value = F.col("value")
    rows = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", 50)
        .load()
        .select(
            F.concat(F.lit("r-"), value.cast("string")).alias("id"),
            F.lit("job.a").alias("kind"),
            F.when(value % 10 == 7, "soon")
            .when(value % 2 == 0, "0s")
            .otherwise("1s")
            .alias("wait"),
            F.to_json(F.struct(value.alias("n"))).alias("payload"),
        )
    )
    seen: list[int] = []
    stream = schedule_stream(
        rows,
        url=rabbitmq_url,
        topology=topology,
        checkpoint=str(tmp_path / "checkpoint"),
        key_col="id",
        routing_key_col="kind",
        delay_col="wait",
        body_col="payload",
        body_json=True,
        errors_path=str(tmp_path / "errors"),
        trigger="1s",
        on_batch=lambda batch: seen.append(batch.batch_id),
    )
    try:
        wait_for(
            lambda: sum(b.summary.rows for b in stream.batches) >= 100,
            90,
            lambda: f"100 rows scheduled (batches: {[b.line() for b in stream.batches]})",
        )
    finally:
        stream.stop()
    assert not stream.is_active and stream.error is None
    batches = stream.batches
    assert [b.batch_id for b in batches] == seen == sorted(seen)
    published = sum(b.summary.total_published for b in batches)
    rejected = sum(b.summary.total_rejected for b in batches)
    rows_in = sum(b.summary.rows for b in batches)
    assert published + rejected == rows_in and rejected == rows_in // 10 + (rows_in % 10 > 7)
    for batch in batches:  # each batch's rejections in a folder of its own
        errors = read_errors(tmp_path / "errors" / f"batch={batch.batch_id}")
        assert len(errors) == batch.summary.total_rejected
        assert {e["error"] for e in errors} <= {"InvalidDelay"}
    work = f"{topology.namespace}.work"
    wait_for(lambda: depth(rabbitmq_url, work) == published, 30, "every message in the queue")
    import pika

    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    try:
        channel = connection.channel()
        method, props, body = channel.basic_get(work, auto_ack=False)
        assert method is not None
        n = json.loads(body)["n"]
        assert props.message_id == key_message_id(topology.namespace, f"r-{n}")
    finally:
        connection.close()


def test_a_batch_left_unconfirmed_fails_the_query_uncommitted_and_a_restart_sends_it(
    spark: Any,
    rabbitmq_url: str,
    topo_file: tuple[Any, Path],
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """The topology deleted under a running stream: batch 1's rows cannot be published,
    the query stops (exit 1, one error line) without committing it; once the topology is
    back, ``--available-now`` on the same checkpoint runs batch 1 again and exits 0."""
    topology, topo = topo_file
    (tmp_path / "in").mkdir()
    checkpoint = tmp_path / "checkpoint"
    drop_csv(tmp_path / "in", "a.csv", range(0, 20))
    args = stream_args(tmp_path, topo, rabbitmq_url, "--retry-for", "1s", "--trigger", "200ms")

    def break_the_broker() -> None:
        wait_for(lambda: 0 in commits(checkpoint), 90, "batch 0 committed")
        delete_topology(topology, rabbitmq_url)
        drop_csv(tmp_path / "in", "b.csv", range(20, 50))

    breaker = threading.Thread(target=break_the_broker)
    breaker.start()
    try:
        code = main(args)
    finally:
        breaker.join()
    out, err = capfd.readouterr()
    assert code == 1, err
    assert out.splitlines()[0] == "batch 0: 20 rows, 20 published, 0 rejected, 0 duplicate-in-input"
    [line] = [x for x in err.splitlines() if x.startswith("delayq: error:")]
    assert "delayq: error: batch 1 was not committed: 30 of 30 rows were not confirmed" in line
    assert "restart it with the same checkpoint" in line
    assert "Traceback" not in err and "at org.apache" not in err
    assert commits(checkpoint) == {0}

    apply_topology(topology, rabbitmq_url)  # the queues come back empty
    assert main([*args[: args.index("--trigger")], "--available-now"]) == 0
    out, _ = capfd.readouterr()
    assert out.splitlines() == ["batch 1: 30 rows, 30 published, 0 rejected, 0 duplicate-in-input"]
    assert commits(checkpoint) == {0, 1}
    work = f"{topology.namespace}.work"
    wait_for(lambda: depth(rabbitmq_url, work) == 30, 30, "batch 1's 30 messages")
    # Nothing new: --available-now runs no batch and exits 0 all the same.
    assert main([*args[: args.index("--trigger")], "--available-now"]) == 0
    assert capfd.readouterr().out == ""


def _start(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "delayq", *argv],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=ROOT,
            start_new_session=True,  # its JVM and Python workers in its group: killed together
        )


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def test_files_dropped_in_are_handled_once_through_a_sigkill_and_a_restart(
    rabbitmq_url: str, topo_file: tuple[Any, Path], tmp_path: Path
) -> None:
    """The CLI in a process of its own, killed with SIGKILL after batch 0 published. The
    kill is made to land between publishing and committing (the commit of batch 0 taken
    out of the checkpoint, as if the process had died a moment earlier): the restart runs
    batch 0 again, every row of it a duplicate the idempotent consumer skips."""
    topology, topo = topo_file
    (tmp_path / "in").mkdir()
    checkpoint = tmp_path / "checkpoint"
    log = tmp_path / "stream.log"
    drop_csv(tmp_path / "in", "a.csv", range(0, 100))
    args = [
        *stream_args(tmp_path, topo, rabbitmq_url, "--trigger", "500ms"),
        "--master",
        "local[2]",
    ]
    seen = Seen()
    running = Running(
        AsyncConsumer(
            rabbitmq_url,
            topology,
            f"{topology.namespace}.work",
            seen.handle,
            store=InMemoryStore(),
            observers=[seen],
        )
    )
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(_start(args, log))
        wait_for(lambda: 0 in commits(checkpoint), 120, lambda: f"batch 0: {log.read_text()}")
        os.killpg(procs[0].pid, signal.SIGKILL)
        procs[0].wait(30)
        wait_for(lambda: _group_gone(procs[0].pid), 30, "the killed JVM gone")
        # Died before the commit: neither the commit file nor Hadoop's checksum beside it
        # (a stale `.0.crc` fails the restart's own commit as a concurrent writer's).
        (checkpoint / "commits" / "0").unlink()
        (checkpoint / "commits" / ".0.crc").unlink(missing_ok=True)
        wait_for(lambda: len(seen.handled) == 100, 60, lambda: f"rows 0-99 ({seen.outcomes})")

        procs.append(_start(args, log))
        wait_for(lambda: 0 in commits(checkpoint), 120, lambda: f"batch 0 again: {log.read_text()}")
        drop_csv(tmp_path / "in", "b.csv", range(100, 250))
        wait_for(
            lambda: len(seen.handled) == 250 and seen.outcomes["duplicate"] >= 100,
            90,
            lambda: f"rows 0-249 handled, 100 duplicates ({seen.outcomes}): {log.read_text()}",
        )
        procs[1].send_signal(signal.SIGTERM)
        assert procs[1].wait(60) == 0, log.read_text()
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)
        running.stop()
    text = log.read_text()
    assert "batch 0: 100 rows, 100 published" in text  # twice: killed, then re-run
    assert text.count("batch 0: 100 rows, 100 published") == 2
    assert "150 rows, 150 published" in text
    assert "Traceback" not in text
    assert sorted(seen.handled) == sorted(str(n) for n in range(250))
    assert set(seen.handled.values()) == {1}  # each row handled exactly once
    assert seen.outcomes["ack"] == 250 and seen.outcomes["duplicate"] == 100
    assert read_errors(tmp_path / "errors" / "batch=0") == []


# --- misuse ------------------------------------------------------------------------


def _rate(spark: Any) -> Any:
    from pyspark.sql import functions as F

    return (
        spark.readStream.format("rate")
        .load()
        .select(
            F.col("value").cast("string").alias("key"),
            F.lit("job.a").alias("routing_key"),
            F.lit("1s").alias("delay"),
        )
    )


def test_streaming_and_batch_dataframes_are_refused_by_the_other_function(
    spark: Any, rabbitmq_url: str, topo_file: tuple[Any, Path], tmp_path: Path
) -> None:
    topology, _ = topo_file
    static = spark.createDataFrame(
        [("a", "job.a", "1s")], "key string, routing_key string, delay string"
    )
    with pytest.raises(
        InvalidInput, match=r"not a streaming DataFrame: schedule it with delayq\.spark\.schedule"
    ):
        schedule_stream(
            static,
            url=rabbitmq_url,
            topology=topology,
            checkpoint=str(tmp_path),
            delay_col="delay",
            body_col=None,
        )
    with pytest.raises(InvalidInput, match=r"is a streaming DataFrame .*schedule_stream"):
        schedule(
            _rate(spark), url=rabbitmq_url, topology=topology, delay_col="delay", body_col=None
        )
    assert not spark.streams.active


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        ({"checkpoint": ""}, "schedule_stream needs a checkpoint"),
        ({"checkpoint": None}, "schedule_stream needs a checkpoint"),
        ({"trigger": "10"}, "trigger"),  # a bare number has no unit
        ({"trigger": "soon"}, "'available-now' to process what is there"),
        ({"trigger": True}, "trigger must be a duration or 'available-now'"),
        ({"delay_col": "wait"}, "the input has no column 'wait'"),
        ({"errors_format": "xml"}, "errors_format must be json, csv or parquet"),
        ({"backoff": "0s"}, "backoff must be at least 1ms"),
    ],
)
def test_bad_settings_are_refused_before_the_query_starts(
    spark: Any,
    rabbitmq_url: str,
    topo_file: tuple[Any, Path],
    tmp_path: Path,
    settings: dict[str, Any],
    said: str,
) -> None:
    topology, _ = topo_file
    given: dict[str, Any] = {"checkpoint": str(tmp_path / "c"), "delay_col": "delay", **settings}
    with pytest.raises(InvalidInput, match=re.escape(said)):
        schedule_stream(_rate(spark), url=rabbitmq_url, topology=topology, body_col=None, **given)
    assert not spark.streams.active


def test_a_dead_broker_or_an_unapplied_topology_is_said_before_the_query_starts(
    spark: Any, rabbitmq_url: str, make_topology: Any, topo_file: tuple[Any, Path], tmp_path: Path
) -> None:
    applied, _ = topo_file
    common: dict[str, Any] = {
        "checkpoint": str(tmp_path / "c"),
        "delay_col": "delay",
        "body_col": None,
    }
    with pytest.raises(ConnectionFailed):
        schedule_stream(
            _rate(spark), url="amqp://guest:guest@127.0.0.1:1/", topology=applied, **common
        )
    with pytest.raises(TopologyMissing, match="delayq topology apply"):
        schedule_stream(_rate(spark), url=rabbitmq_url, topology=make_topology(), **common)
    assert not spark.streams.active
    assert not (tmp_path / "c").exists()  # no query was started


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (
            lambda a: [x for x in a if x not in ("--schema", SCHEMA)],
            "--schema is required for a csv stream",
        ),
        (
            lambda a: [*a, "--trigger", "1s", "--available-now"],
            "--available-now is not allowed with --trigger",
        ),
        (lambda a: [*a, "--trigger", "often"], "trigger"),
        (
            lambda a: a[: a.index("--checkpoint")] + a[a.index("--checkpoint") + 2 :],
            "Missing option '--checkpoint'",
        ),
        (lambda a: [*a, "--retry-for", "60"], "retry_for"),
    ],
)
def test_the_command_refuses_misuse_in_one_line(
    spark: Any,
    rabbitmq_url: str,
    topo_file: tuple[Any, Path],
    tmp_path: Path,
    change: Any,
    said: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, topo = topo_file
    (tmp_path / "in").mkdir()
    assert main(change(stream_args(tmp_path, topo, rabbitmq_url))) == 2
    err = capsys.readouterr().err
    [line] = [x for x in err.splitlines() if x.startswith("delayq: error:")]
    assert said in line
    assert "Traceback" not in err
    assert not spark.streams.active


def test_the_command_wants_a_folder_to_watch(
    rabbitmq_url: str,
    topo_file: tuple[Any, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, topo = topo_file
    assert main(stream_args(tmp_path, topo, rabbitmq_url)) == 2
    assert f"--input {tmp_path / 'in'} is not a directory" in capsys.readouterr().err
