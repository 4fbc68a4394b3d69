"""``--resume`` of a job killed mid-way (issue 48): the same input is known again in
another session, whatever its format (Parquet's plan hash was not), a changed one is
refused, and the resumed job sends again only the partitions not confirmed whole."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pika
import pytest

from delayq.errors import InvalidInput
from delayq.spark import schedule
from delayq.spark._inputs import input_columns
from delayq.spark._run_record import RunRecord, input_identity, resume_plan
from delayq.sync import apply_topology
from tests.spark_jvm import SUBMIT_ARGS

SCHEMA = "key string, routing_key string, delay string, body string"
PARTITIONS = 20
PER = 500
ROWS = PARTITIONS * PER
KILL_AT = 10
"""The partition whose task kills the job, once that many others were confirmed whole."""


def _write_inputs(spark: Any, root: Path) -> dict[str, tuple[str, Path]]:
    """One small input per format: (Spark format, path)."""
    rows = [(f"k{n}", "job.a", "1h", str(n)) for n in range(40)]
    df = spark.createDataFrame(rows, SCHEMA)
    df.repartition(3).write.parquet(str(root / "parquet"))
    df.repartition(2).write.orc(str(root / "orc"))
    df.coalesce(1).write.option("header", "true").csv(str(root / "csv"))
    folder = root / "jsonl"
    folder.mkdir()
    for part in range(3):
        (folder / f"part-{part}.json").write_text(
            "".join(
                json.dumps({"key": f"k{n}", "routing_key": "job.a", "delay": "1h", "body": n})
                + "\n"
                for n in range(part * 10, part * 10 + 10)
            )
        )
    return {
        "parquet": ("parquet", root / "parquet"),
        "orc": ("orc", root / "orc"),
        "csv": ("csv", root / "csv"),
        "jsonl folder": ("json", folder),
        "jsonl file": ("json", folder / "part-0.json"),
    }


def _identity(spark: Any, fmt: str, path: Path, **options: str) -> dict[str, Any]:
    reader = spark.read.options(**options)
    if fmt == "csv":
        reader = reader.option("header", "true")
    df = reader.format(fmt).load(str(path))
    selected = input_columns(df, "key", "routing_key", "delay", None, "body")
    return input_identity(df, selected)


_IDENTITIES = """
import json, sys
from pathlib import Path
from delayq.spark import local_session
from tests.spark.test_resume_killed import _identity

inputs = json.loads(sys.argv[1])
spark = local_session("local[1]", app_name="delayq-identity-test", ui=False)
spark.sparkContext.setLogLevel("ERROR")
try:
    print(json.dumps({name: _identity(spark, fmt, Path(path)) for name, (fmt, path) in
                      inputs.items()}))
finally:
    spark.stop()
"""


def _refused(before: dict[str, Any], now: dict[str, Any]) -> str:
    """The reason a resume of a run of input ``before`` is refused for input ``now``."""
    record = RunRecord.start(before, dry_run=False, resumed_from=None, errors_format="json")
    with pytest.raises(InvalidInput) as caught:
        resume_plan(record, now, "errors")
    return str(caught.value)


def test_the_same_input_read_in_another_session_is_the_same_and_a_changed_one_is_not(
    spark: Any, tmp_path: Path
) -> None:
    inputs = _write_inputs(spark, tmp_path)
    # Read once by another Spark session (another process), as a killed run's was.
    done = subprocess.run(
        [sys.executable, "-c", _IDENTITIES,
         json.dumps({name: (fmt, str(path)) for name, (fmt, path) in inputs.items()})],
        capture_output=True, text=True, timeout=240, cwd=Path(__file__).parents[2],
        env={**os.environ, **SUBMIT_ARGS},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    then = json.loads(done.stdout.strip().splitlines()[-1])
    for name, (fmt, path) in inputs.items():
        now = _identity(spark, fmt, path)
        assert now == then[name], name
        record = RunRecord.start(then[name], dry_run=False, resumed_from=None, errors_format="json")
        resume_plan(record, now, "errors")  # accepted: no InvalidInput

    # A file added, removed, rewritten; another schema; other reader options.
    fmt, parquet = inputs["parquet"]
    before = _identity(spark, fmt, parquet)
    first = sorted(parquet.glob("part-*.parquet"))[0]
    shutil.copy(first, parquet / "part-99999-added.parquet")
    assert f"{(parquet / 'part-99999-added.parquet').as_uri()} was not read then" in _refused(
        before, _identity(spark, fmt, parquet)
    )
    (parquet / "part-99999-added.parquet").unlink()
    first.unlink()
    assert f"{first.as_uri()} is no longer read" in _refused(before, _identity(spark, fmt, parquet))

    fmt, folder = inputs["jsonl folder"]
    before = _identity(spark, fmt, folder)
    rewritten = folder / "part-1.json"
    rewritten.write_text(rewritten.read_text().replace('"1h"', '"2h"'))
    os.utime(rewritten, ns=(time.time_ns(), time.time_ns() + 10**9))  # another mtime, surely
    assert f"{rewritten.as_uri()} changed: " in _refused(before, _identity(spark, fmt, folder))

    fmt, single = inputs["jsonl file"]
    before = _identity(spark, fmt, single)
    assert "its schema changed: " in _refused(
        before, _identity(spark, fmt, single, primitivesAsString="true")
    )
    assert "another source, reader options or columns" in _refused(
        before, _identity(spark, fmt, single, allowComments="true")
    )


def _markers(done_dir: Path) -> list[Path]:
    """The markers of partitions confirmed whole (not Hadoop's ``.crc`` files beside them)."""
    if not done_dir.is_dir():
        return []
    return [p for p in done_dir.iterdir() if not p.name.startswith(".")]


def killed_at(partition: int, sent: int, done_dir: str, finished: int) -> Callable[[], Any]:
    """A tracing provider factory whose span processor, at the ``sent``-th ``publish`` of
    ``partition``'s task, waits until ``finished`` partitions are marked confirmed whole
    in ``done_dir`` (a state, not a time), then SIGKILLs the whole job: the driver's
    process group (``KILL_GROUP``) and its own (PySpark's daemon and workers)."""

    def make_provider() -> Any:
        from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
        from pyspark import TaskContext

        class KillJob(SpanProcessor):
            started = 0

            def on_start(self, span: Any, parent_context: Any = None) -> None:
                task = TaskContext.get()
                if task is None or task.partitionId() != partition:
                    return
                KillJob.started += 1
                if KillJob.started != sent:
                    return
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline:
                    if len(_markers(Path(done_dir))) >= finished:
                        break
                    time.sleep(0.05)
                os.killpg(int(os.environ["KILL_GROUP"]), signal.SIGKILL)
                os.killpg(os.getpgid(0), signal.SIGKILL)

        provider = TracerProvider()
        provider.add_span_processor(KillJob())
        return provider

    return make_provider


_KILLED = """
import os, sys
from delayq import Topology
from delayq.spark import local_session, schedule
from tests.spark.test_resume_killed import KILL_AT, PARTITIONS, killed_at

url, topology, source, errors = sys.argv[1:5]
os.environ["KILL_GROUP"] = str(os.getpgid(0))  # before the JVM: its workers inherit it
spark = local_session("local[2]", app_name="delayq-killed-test", ui=False)
spark.sparkContext.setLogLevel("ERROR")
schedule(spark.read.parquet(source), url=url, topology=Topology.model_validate_json(topology),
         delay_col="delay", errors_path=errors, partitions=PARTITIONS, window=1,
         tracing=killed_at(KILL_AT, 100, errors + "/_delayq_done", KILL_AT))
print("not killed")
"""


def _received(url: str, queue: str) -> Counter[str]:
    """The message ids of the messages in ``queue`` (taken off it), counted: until every
    row's is there (a lost row fails at the timeout), then what is left."""
    seen: Counter[str] = Counter()
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=1000)
        for method, properties, _body in channel.consume(queue, inactivity_timeout=60):
            assert method is not None, f"{ROWS - len(seen)} rows never reached {queue}"
            channel.basic_ack(method.delivery_tag)
            seen[properties.message_id] += 1
            if len(seen) == ROWS:
                break
        channel.cancel()  # requeues what was prefetched, unacked
        while True:
            method, properties, _body = channel.basic_get(queue, auto_ack=True)
            if method is None:
                return seen
            seen[properties.message_id] += 1
    finally:
        connection.close()


def test_a_parquet_job_killed_mid_way_resumed_sends_only_what_was_not_confirmed_whole(
    spark: Any, rabbitmq_url: str, make_topology: Any, tmp_path: Path
) -> None:
    topology = make_topology(ladder=["1s", "1h"])
    apply_topology(topology, rabbitmq_url)
    tier = f"{topology.namespace}.tier.1h"
    source = tmp_path / "rows.parquet"
    rows = [(f"k{n}", "job.a", "1h", str(n)) for n in range(ROWS)]
    spark.createDataFrame(rows, SCHEMA).repartition(4).write.parquet(str(source))
    errors = tmp_path / "errors"
    # Its own Spark in a process of its own, killed whole (driver, JVM, workers) as
    # partition KILL_AT's task starts its 100th publish, once KILL_AT others were marked
    # confirmed whole; the other core may be half-way through another partition.
    killed = subprocess.run(
        [sys.executable, "-c", _KILLED, rabbitmq_url, topology.model_dump_json(),
         str(source), str(errors)],
        capture_output=True, text=True, timeout=300, cwd=Path(__file__).parents[2],
        env={**os.environ, **SUBMIT_ARGS}, start_new_session=True,
    )  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, (killed.stdout, killed.stderr[-3000:])
    record = json.loads((errors / "_delayq_run.json").read_text())
    assert record["state"] == "running"
    marked = len(_markers(errors / "_delayq_done"))
    assert KILL_AT <= marked < PARTITIONS - 1

    summary = schedule(
        spark.read.parquet(str(source)),
        url=rabbitmq_url,
        topology=topology,
        delay_col="delay",
        errors_path=str(tmp_path / "errors-2"),
        partitions=PARTITIONS,
        resume_from=str(errors),
    )
    # The partitions marked were skipped, the others sent.
    assert summary.skipped >= marked * (PER - 1), summary.render()
    assert summary.total_published == ROWS - summary.skipped, summary.render()
    assert "were skipped where this run's held the same rows" in summary.render()
    assert f"skipped: {summary.skipped:,} rows the resumed run got confirmed" in summary.render()
    # Every row at the broker at least once; copies only of rows of the partitions the
    # kill left unconfirmed whole: KILL_AT's first 99 (confirmed one at a time: window
    # 1), and at most two more (the other core's, and one finished as the kill came, its
    # marker not yet written).
    received = _received(rabbitmq_url, tier)
    assert len(received) == ROWS
    duplicates = sum(received.values()) - ROWS
    assert max(received.values()) <= 2
    assert 99 <= duplicates <= 99 + 2 * (PER + 1), duplicates
    # The resumed run's own markers carry the skipped partitions on: a kill of it loses
    # nothing the first run had confirmed. (Its errors output replaced them once whole.)
    assert json.loads((tmp_path / "errors-2" / "_delayq_run.json").read_text())["state"] == (
        "complete"
    )
