"""A scheduling job that Spark itself fails: a clear delayq error with the figures of the
partitions that finished, never pages of Java and Python stack and never a green exit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from delayq import SparkJobFailed
from delayq.cli import main
from delayq.spark import schedule
from delayq.sync import apply_topology
from tests.amqp import depth
from tests.waiting import wait_for

PARTITIONS = 4
ROWS = PARTITIONS * 1024  # parallelize slices in batches of 1024: 4 equal partitions
TRIGGER = f"k{ROWS - 1}"  # the last row of the last partition


def _failing_frame(spark: Any, counter: Path, column: str = "body") -> Any:
    """Rows ``k0..`` in 4 partitions, in order; ``column`` comes from a UDF (a user's, with
    a bug) that raises the first time it reads the last row."""
    from pyspark.sql import functions as F

    def body(key: str) -> str:
        if key == TRIGGER:
            seen = int(counter.read_text() or "0") + 1 if counter.exists() else 1
            counter.write_text(str(seen))
            if seen == 1:
                raise RuntimeError(f"injected failure reading {key}")
        return f'{{"k": "{key}"}}'

    rows = [(f"k{n}", "job.a", "0s") for n in range(ROWS)]
    df = spark.sparkContext.parallelize(rows, PARTITIONS).toDF(
        "key string, routing_key string, delay string"
    )
    made = F.udf(body, "string")(F.col("key"))
    return df.withColumn(column, made)


def test_a_job_spark_fails_mid_way_says_why_in_one_line_and_counts_the_finished_partitions(
    spark: Any, rabbitmq_url: str, make_topology: Any, tmp_path: Path
) -> None:
    topology = make_topology()
    apply_topology(topology, rabbitmq_url)
    work = f"{topology.namespace}.work"
    counter = tmp_path / "reads"
    # The repeated-keys check reads the keys only (Spark leaves the body out): the body's
    # UDF first runs, and fails, while the last partition publishes.
    df = _failing_frame(spark, counter)

    with pytest.raises(SparkJobFailed) as caught:
        schedule(df, url=rabbitmq_url, topology=topology, delay_col="delay", body_col="body")
    message = str(caught.value)
    assert f"RuntimeError: injected failure reading {TRIGGER}" in message
    assert "Traceback" not in message and "\n" not in message
    summary = caught.value.summary
    # Local mode runs 2 tasks at a time and starts them in order: the last partition
    # starts only once two others have finished.
    assert ROWS // PARTITIONS * 2 <= summary.total_published < ROWS
    assert summary.unfinished >= 1 and summary.total_rejected == 0
    assert "job failed: " in summary.render()
    # Everything counted as published is at the broker (a partition that did not finish
    # may have sent more).
    wait_for(
        lambda: depth(rabbitmq_url, work) >= summary.total_published,
        30,
        "every counted message in the work queue",
    )

    # The same input again (the failure does not recur): everything is published; what
    # the first run sent is a duplicate, which an idempotent consumer skips.
    again = schedule(df, url=rabbitmq_url, topology=topology, delay_col="delay")
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
from tests.spark.test_job_failure import _failing_frame
from pathlib import Path

url, topology, counter = sys.argv[1], Topology.model_validate_json(sys.argv[2]), sys.argv[3]
spark = local_session("local[2,2]", app_name="delayq-rerun-test")  # a task may fail twice
spark.sparkContext.setLogLevel("ERROR")
try:
    summary = schedule(_failing_frame(spark, Path(counter)), url=url,
                       topology=topology, delay_col="delay", body_col="body")
    print(json.dumps({"published": summary.total_published, "rerun": summary.rerun,
                      "render": summary.render()}))
finally:
    spark.stop()
"""


def test_a_task_spark_runs_again_publishes_its_partition_again_and_counts_it_as_rerun(
    rabbitmq_url: str, make_topology: Any, tmp_path: Path
) -> None:
    topology = make_topology()
    apply_topology(topology, rabbitmq_url)
    # Its own Spark (local[2,2]: a failed task is tried again), in a process of its own.
    done = subprocess.run(
        [sys.executable, "-c", _RERUN, rabbitmq_url, topology.model_dump_json(),
         str(tmp_path / "reads")],
        capture_output=True, text=True, timeout=240, cwd=Path(__file__).parents[2],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout.strip().splitlines()[-1])
    # The last partition failed once on its last row, then ran again: every row is
    # published once in the summary, and that partition's rows are counted as rerun.
    assert said["published"] == ROWS and said["rerun"] == ROWS // PARTITIONS
    assert "rerun: 1024 published rows of tasks Spark ran again" in said["render"]
    work = f"{topology.namespace}.work"
    wait_for(lambda: depth(rabbitmq_url, work) >= ROWS, 30, "every row in the work queue")
    # The failed attempt's sends are the only duplicates: at most the rerun count.
    assert depth(rabbitmq_url, work) <= ROWS + said["rerun"]
