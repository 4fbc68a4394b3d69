"""delayq.spark.schedule reads its input once: the rows counted for progress, the
repeated keys found, the rows published all come from one pass over the source.

The source here is an RDD whose every row read adds 1 to an accumulator, so the
accumulator ends at (rows x passes): a job that reads the input twice would count
each row twice.
"""

from __future__ import annotations

from typing import Any

import pytest

from delayq.spark import schedule
from delayq.sync import apply_topology
from tests.amqp import depth
from tests.waiting import wait_for

SCHEMA = "key string, routing_key string, delay string, body string, ref string"
ROWS = 120


def counted_source(spark: Any, *, repeated: int) -> tuple[Any, Any]:
    """A DataFrame of ``ROWS`` rows in 3 partitions, the first ``repeated`` sharing
    one key, and the accumulator its reads count in."""
    reads = spark.sparkContext.accumulator(0)

    def row(n: int) -> tuple[str, str, str, str, str]:
        reads.add(1)
        key = "twice" if n < repeated else f"k{n}"
        return (key, "job.a", "1s", f"body {n}", f"r{n}")

    rdd = spark.sparkContext.parallelize(range(ROWS), 3).map(row)
    return spark.createDataFrame(rdd, SCHEMA), reads


@pytest.mark.parametrize(
    ("duplicates", "repeated", "dry_run"),
    [("reject", 0, False), ("reject", 2, True), ("keep-last", 3, False)],
)
def test_each_input_row_is_read_once_with_progress_and_repeated_keys(
    spark: Any, rabbitmq_url: str, make_topology: Any, duplicates: str, repeated: int,
    dry_run: bool,
) -> None:
    topology = make_topology()
    apply_topology(topology, rabbitmq_url)
    df, reads = counted_source(spark, repeated=repeated)
    told: list[tuple[int, int]] = []
    summary = schedule(
        df,
        url=rabbitmq_url,
        topology=topology,
        delay_col="delay",
        duplicates=duplicates,
        max_rejected=None,
        dry_run=dry_run,
        progress=lambda done, total: told.append((done, total)),
    )
    assert reads.value == ROWS  # one pass over the source, whatever the job did with it
    kept = 1 if duplicates == "keep-last" and repeated else 0
    unique = ROWS - repeated + kept
    assert summary.total_published == unique
    assert summary.duplicate_in_input == (repeated - kept if repeated else 0)
    assert summary.total_rejected == (repeated if duplicates == "reject" else 0)
    assert told[-1] == (unique, unique)
    if not dry_run:
        tier = f"{topology.namespace}.tier.1s"
        work = f"{topology.namespace}.work"
        wait_for(lambda: depth(rabbitmq_url, tier) + depth(rabbitmq_url, work) == unique, 30,
                 "every kept row at the broker")


def test_a_single_file_read_as_one_full_split_and_empty_ones_is_spread_anyway(
    spark: Any, tmp_path: Any
) -> None:
    from delayq.spark._inputs import input_columns, prepare

    source = str(tmp_path / "one")
    spark.createDataFrame([(f"k{n}", "job.a", "1s") for n in range(200)],
                          "key string, routing_key string, delay string"
                          ).coalesce(1).write.parquet(source)
    before = spark.conf.get("spark.sql.files.maxPartitionBytes")
    spark.conf.set("spark.sql.files.maxPartitionBytes", "200")  # several splits, one row group
    try:
        df = spark.read.parquet(source)
        sizes = df.rdd.glom().map(len).collect()
        assert len(sizes) >= 2 and sorted(sizes)[-2:] == [0, 200]  # what issue 16 saw
        selected = input_columns(df, "key", "routing_key", "delay", None, None)
        prepared = prepare(selected, duplicates="reject", partitions=None, key_col="key")
        spread = prepared.rows.rdd.glom().map(len).collect()
        assert len(spread) == len(sizes) and max(spread) <= 1.5 * 200 / len(spread)
        prepared.release()
    finally:
        spark.conf.set("spark.sql.files.maxPartitionBytes", before)

    even = spark.createDataFrame([(f"k{n}", "job.a", "1s") for n in range(200)],
                                 "key string, routing_key string, delay string").repartition(4)
    selected = input_columns(even, "key", "routing_key", "delay", None, None)
    prepared = prepare(selected, duplicates="reject", partitions=None, key_col="key")
    as_read = selected.rdd.glom().map(lambda p: sorted(r["key"] for r in p)).collect()
    given = prepared.rows.rdd.glom().map(lambda p: sorted(r["key"] for r in p)).collect()
    assert given == as_read and [len(p) for p in given] == [50, 50, 50, 50]  # not shuffled
    prepared.release()
