"""A scheduling job that Spark itself fails: a clear delayq error with the figures of the
partitions that finished, never pages of Java and Python stack and never a green exit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from delayq import SparkJobFailed
from delayq.cli import main
from delayq.spark import schedule
from delayq.sync import apply_topology
from tests.amqp import depth
from tests.spark_jvm import SUBMIT_ARGS
from tests.waiting import wait_for

PARTITIONS = 8
PER = 1000
ROWS = PARTITIONS * PER  # parallelize slices in batches (here of PER rows): equal partitions
TRIGGER = f"k{ROWS - 1}"  # the last row


def _frame(spark: Any, bad_every: int = 0) -> Any:
    """Rows ``k0..`` in order, ``PER`` to a partition; with ``bad_every``, every such row
    has a bare number for its delay (a rejection, ``InvalidDelay``)."""
    rows = [
        (f"k{n}", "job.a", "5" if bad_every and n % bad_every == 0 else "0s", "{}", f"r{n}")
        for n in range(ROWS)
    ]
    return spark.sparkContext.parallelize(rows, PARTITIONS).toDF(
        "key string, routing_key string, delay string, body string, ref string"
    )


def _failing_frame(spark: Any, counter: Path, column: str = "body") -> Any:
    """:func:`_frame`, its ``column`` from a UDF (a user's, with a bug) that raises the
    first time it reads the last row."""
    from pyspark.sql import functions as F

    def made(key: str) -> str:
        if key == TRIGGER:
            seen = int(counter.read_text() or "0") + 1 if counter.exists() else 1
            counter.write_text(str(seen))
            if seen == 1:
                raise RuntimeError(f"injected failure reading {key}")
        return key if column == "key" else "{}"

    return _frame(spark).withColumn(column, F.udf(made, "string")(F.col("key")))


def _python_workers(root: int) -> list[int]:
    """The Python workers (children of ``pyspark.daemon``) below process ``root``."""
    children: dict[int, list[int]] = {}
    commands: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            commands[int(entry.name)] = (entry / "cmdline").read_bytes().decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    below, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            below.append(child)
            todo.append(child)
    daemons = {p for p in below if "pyspark.daemon" in commands.get(p, "")}
    return [p for p in below if p in daemons and any(p in children.get(d, []) for d in daemons)]


def kill_workers_once_read(fraction: float) -> Any:
    """A ``progress`` callback that SIGKILLs this process's Spark Python workers once the
    publishing tasks have read ``fraction`` of the rows: tasks die mid-publish, as on a
    lost executor."""
    fired: list[int] = []

    def progress(done: int, total: int) -> None:
        if not fired and total and done >= fraction * total:
            fired.extend(_python_workers(os.getpid()))
            for pid in fired:
                os.kill(pid, signal.SIGKILL)

    return progress


def killed_once_at(partition: int, sent: int) -> Callable[[], Any]:
    """A tracing provider factory (``tracing=``; each Python worker builds its provider)
    whose span processor SIGKILLs its own worker when the first attempt of
    ``partition``'s publishing task starts its ``sent``-th ``publish`` span: that task
    dies in the middle of its publishes, from inside (as on a lost executor), whatever
    the machine's load; every other task runs once."""

    def make_provider() -> Any:
        from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
        from pyspark import TaskContext

        class KillMidway(SpanProcessor):
            started = 0

            def on_start(self, span: Any, parent_context: Any = None) -> None:
                task = TaskContext.get()
                if task is None or (task.partitionId(), task.attemptNumber()) != (partition, 0):
                    return
                KillMidway.started += 1
                if KillMidway.started == sent:
                    os.kill(os.getpid(), signal.SIGKILL)

        provider = TracerProvider()
        provider.add_span_processor(KillMidway())
        return provider

    return make_provider


def test_a_job_spark_fails_mid_way_says_why_in_one_line_and_counts_the_finished_partitions(
    spark: Any, rabbitmq_url: str, make_topology: Any, tmp_path: Path
) -> None:
    topology = make_topology()
    apply_topology(topology, rabbitmq_url)
    work = f"{topology.namespace}.work"
    errors = tmp_path / "errors"
    errors.mkdir()
    (errors / "part-stale.json").write_text('{"key": "from an earlier run"}\n')
    with pytest.raises(SparkJobFailed) as caught:
        schedule(
            _frame(spark, bad_every=10),
            url=rabbitmq_url,
            topology=topology,
            delay_col="delay",
            window=1,  # one row at a time: the job is still publishing when the kill comes
            progress=kill_workers_once_read(0.5),
            errors_path=str(errors),
            id_col="ref",
            max_rejected=None,
        )
    message = str(caught.value)
    assert message.startswith("the Spark job failed: ") and "\n" not in message, message
    assert "Python worker exited unexpectedly" in message and "Traceback" not in message
    summary = caught.value.summary
    # Half the rows read, at most two partitions in progress (local[2]): at least two of
    # the eight finished, and not all; a tenth of each finished partition was rejected.
    finished = summary.total_rejected // (PER // 10)
    assert 2 <= finished < PARTITIONS and summary.total_rejected == finished * PER // 10
    assert summary.total_published == finished * (PER - PER // 10), summary.render()
    assert summary.unfinished == PARTITIONS - finished
    assert f"{finished} of {PARTITIONS} partitions finished" in message
    assert "job failed: " in summary.render()
    # The finished partitions' rejections are in the errors output, each with its
    # reason and id, the earlier run's file gone; the message and the summary say where.
    assert f"The errors output ({errors}) names the rejected" in message
    assert f"rejections written to {errors}" in summary.render()
    written = [
        json.loads(line)
        for part in errors.glob("part-*")
        for line in part.read_text().splitlines()
        if line
    ]
    assert len(written) == summary.total_rejected, written[:3]
    assert all(int(row["key"][1:]) % 10 == 0 for row in written)
    assert {row["error"] for row in written} == {"InvalidDelay"}
    assert all(row["delay"] == "5" and row["ref"] == f"r{row['key'][1:]}" for row in written)
    # Everything counted as published is at the broker (a partition that did not finish
    # may have sent more).
    wait_for(
        lambda: depth(rabbitmq_url, work) >= summary.total_published,
        30,
        "every counted message in the work queue",
    )
    # The same input again: everything is published; what the first run sent is a
    # duplicate, which an idempotent consumer skips.
    again = schedule(_frame(spark), url=rabbitmq_url, topology=topology, delay_col="delay")
    assert again.total_published == ROWS and again.unfinished == 0


def test_an_input_spark_cannot_read_fails_before_publishing_with_one_line(
    spark: Any, rabbitmq_url: str, make_topology: Any, tmp_path: Path
) -> None:
    topology = make_topology()
    apply_topology(topology, rabbitmq_url)
    df = _failing_frame(spark, tmp_path / "reads", column="key")  # fails the keys' check
    with pytest.raises(SparkJobFailed, match="before publishing: RuntimeError: injected") as e:
        schedule(df, url=rabbitmq_url, topology=topology, delay_col="delay", body_col=None)
    assert "Nothing was published" in str(e.value)
    assert e.value.summary.total_published == 0
    assert depth(rabbitmq_url, f"{topology.namespace}.work") == 0


def test_the_cli_prints_the_summary_then_one_error_line_and_exits_non_zero_on_a_corrupt_file(
    spark: Any,
    rabbitmq_url: str,
    make_topology: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    topology = make_topology()
    apply_topology(topology, rabbitmq_url)
    data = tmp_path / "in"
    rows = [(f"k{n}", "job.a", "1s", "{}") for n in range(100)]
    spark.createDataFrame(
        rows, "key string, routing_key string, delay string, body string"
    ).coalesce(1).write.parquet(str(data))
    # A file truncated in transit, among good ones: the schema comes from a good file,
    # the truncated one fails the task that reads it.
    good = next(data.glob("part-*.parquet"))
    (data / "part-99999-truncated.parquet").write_bytes(good.read_bytes()[:40])
    topo_file = tmp_path / "topology.yaml"
    topo_file.write_text(yaml.safe_dump(topology.model_dump(mode="json")))
    command = ["spark", "schedule", str(data), "--file", str(topo_file), "--url", rabbitmq_url]
    code = main([*command, "--format", "parquet", "--delay-col", "delay"])
    out, err = capsys.readouterr()
    assert code == 1, err  # an exception would have left main: the test would error
    errors = [line for line in err.splitlines() if line.startswith("delayq: error:")]
    assert len(errors) == 1 and "the Spark job failed" in errors[0], err
    assert "total" in out  # the summary, then the error


_RERUN = """
import json, sys
from delayq import Topology
from delayq.spark import local_session, schedule
from tests.spark.test_job_failure import PER, _frame, killed_once_at

url, topology = sys.argv[1], Topology.model_validate_json(sys.argv[2])
spark = local_session("local[2,2]", app_name="delayq-rerun-test", ui=False)  # 2 tries a task
spark.sparkContext.setLogLevel("ERROR")
try:
    summary = schedule(_frame(spark), url=url, topology=topology, delay_col="delay",
                       tracing=killed_once_at(partition=3, sent=PER // 2))
    print(json.dumps({"published": summary.total_published, "rerun": summary.rerun,
                      "render": summary.render()}))
finally:
    spark.stop()
"""


def test_a_task_spark_runs_again_publishes_its_partition_again_and_counts_it_as_rerun(
    rabbitmq_url: str, make_topology: Any
) -> None:
    topology = make_topology()
    apply_topology(topology, rabbitmq_url)
    # Its own Spark (local[2,2]: a failed task is tried again), in a process of its own;
    # one task loses its Python worker half-way through its partition's publishes, as on
    # a lost executor, and Spark runs it again.
    done = subprocess.run(
        [sys.executable, "-c", _RERUN, rabbitmq_url, topology.model_dump_json()],
        capture_output=True, text=True, timeout=240, cwd=Path(__file__).parents[2],
        env={**os.environ, **SUBMIT_ARGS},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout.strip().splitlines()[-1])
    # Every row counted once as published; the partition run again counted as rerun.
    assert said["published"] == ROWS and said["rerun"] == PER, said
    assert f"rerun: {said['rerun']} published rows of tasks Spark ran again" in said["render"]
    work = f"{topology.namespace}.work"
    wait_for(lambda: depth(rabbitmq_url, work) >= ROWS, 30, "every row in the work queue")
    # The failed attempt's sends are the only duplicates: fewer than PER // 2 (it died as
    # its PER // 2-th publish began; what it sent before may all be at the broker).
    assert depth(rabbitmq_url, work) < ROWS + PER // 2
