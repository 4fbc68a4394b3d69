"""Reading a failed job's results back never publishes: a partition whose cached results
are gone comes back as ``lost`` instead of being computed (and published) again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from delayq.spark._resilient import RetryPolicy
from delayq.spark._salvage import salvage
from delayq.spark._schedule_task import publish_partition
from delayq.sync import apply_topology
from tests.amqp import depth


def _publishing(spark: Any, url: str, topology: Any, rows: int) -> Any:
    """An RDD (not persisted) whose two partitions publish ``rows`` task rows when
    computed, one in ten of them a bare-number delay (rejected)."""
    task_rows = [
        (f"k{n}", "job.a", "5" if n % 10 == 0 else "0s", None, None, "{}", f"r{n}")
        for n in range(rows)
    ]
    task = publish_partition(
        url,
        topology.model_dump(mode="json"),
        window=100,
        body_json=False,
        policy=RetryPolicy.parse("5s", "100ms"),
        job="salvage-test",
    )
    return spark.sparkContext.parallelize(task_rows, 2).mapPartitions(task)


def test_salvaging_partitions_whose_results_are_gone_publishes_nothing_and_counts_them_lost(
    spark: Any, rabbitmq_url: str, make_topology: Any, tmp_path: Path
) -> None:
    topology = make_topology()
    apply_topology(topology, rabbitmq_url)
    work = f"{topology.namespace}.work"
    results = _publishing(spark, rabbitmq_url, topology, 200)
    errors = tmp_path / "errors"
    salvaged = salvage(
        spark, results, [0, 1], errors_path=str(errors), errors_format="json", id_col="ref"
    )
    assert salvaged.failed is None and salvaged.written and salvaged.lost == 2
    assert "but for 2 whose cached results were lost" in salvaged.said(str(errors))
    assert depth(rabbitmq_url, work) == 0  # a publish is confirmed before its task ends
    written = [line for part in errors.glob("part-*") for line in part.read_text().splitlines()]
    assert written == []  # written, and empty: nothing of an earlier run passes for this one
    # The same RDD computed by a job of its own publishes: what kept it from publishing
    # above was the salvage.
    assert results.count() > 0
    assert depth(rabbitmq_url, work) == 180


def test_salvaging_cached_results_names_their_rejections_without_publishing_again(
    spark: Any, rabbitmq_url: str, make_topology: Any, tmp_path: Path
) -> None:
    from pyspark import StorageLevel

    topology = make_topology()
    apply_topology(topology, rabbitmq_url)
    work = f"{topology.namespace}.work"
    results = _publishing(spark, rabbitmq_url, topology, 200).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        results.count()
        assert depth(rabbitmq_url, work) == 180
        kept = salvage(spark, results, [1], errors_path=None, errors_format="json", id_col="ref")
        errors = tmp_path / "errors"
        written = salvage(
            spark, results, [0, 1], errors_path=str(errors), errors_format="csv", id_col=None
        )
    finally:
        results.unpersist()
    assert kept.lost == 0 and not kept.written
    assert sorted(row["ref"] for row in kept.rows) == [f"r{n}" for n in range(100, 200, 10)]
    assert {row["error"] for row in kept.rows} == {"InvalidDelay"}
    assert "The summary's rejections name" in kept.said(None)
    lines = [line for part in errors.glob("part-*.csv") for line in part.read_text().splitlines()]
    header = "key,routing_key,delay,tier,error,reason"
    assert lines.count(header) >= 1
    assert sorted(line.split(",")[0] for line in lines if line != header) == sorted(
        f"k{n}" for n in range(0, 200, 10)
    )
    assert depth(rabbitmq_url, work) == 180  # read from the cache: nothing sent again
    assert json.dumps(written.said(str(errors))).count("lost") == 0
