"""What ``bench/spark_schedule.py`` measures: its inputs, each mode (one function each),
the Spark session, and what a Spark mode's own jobs say about where its time went.

A Spark mode's profile comes from the driver's status store (the data Spark's UI shows,
kept with the UI off too), read after the clock stops: the jobs the run started, when
each was submitted and completed, and the durations of the tasks that published.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import aio_pika
from benchlib import purge

from delayq import Message, Topology
from delayq.aio import AsyncPublisher
from delayq.message.bulk import key_message_id
from delayq.message.factory import MessageFactory
from delayq.sync import Publisher

ROUTING_KEY = "job.a"
DELAY = "1h"
PUBLISH_GROUP = "delayq-schedule-"
"""How ``delayq.spark.schedule`` names the job group of its one publishing action."""


@dataclass(frozen=True)
class Inputs:
    file: str
    """One Parquet file (the file itself, not a folder)."""
    folder: str
    """A folder of Parquet files."""


def frame(spark: Any, rows: int, partitions: int) -> Any:
    from pyspark.sql import functions as F

    return spark.range(0, rows, numPartitions=partitions).select(
        F.concat(F.lit("k"), F.col("id").cast("string")).alias("key"),
        F.lit(ROUTING_KEY).alias("routing_key"),
        F.lit(DELAY).alias("delay"),
        F.struct(F.col("id").alias("n")).alias("body"),
    )


def write_inputs(spark: Any, rows: int, files: int, where: Path) -> Inputs:
    """The rows as one Parquet file and as a folder of ``files`` files (untimed)."""
    df = frame(spark, rows, files)
    single = where / "single"
    df.coalesce(1).write.mode("overwrite").parquet(str(single))
    (part,) = single.glob("part-*.parquet")
    file = where / "rows.parquet"
    part.replace(file)
    shutil.rmtree(single)
    folder = where / "folder"
    df.write.mode("overwrite").parquet(str(folder))
    return Inputs(str(file), str(folder))


# What a Spark mode's jobs say --------------------------------------------------------


@dataclass(frozen=True)
class SparkProfile:
    """Where one timed Spark run went, from the status store (seconds)."""

    elapsed: float
    """The clock: ``spark.read.parquet`` and the whole ``schedule`` call."""
    before_s: float
    """Clock start to the publishing job's submission: the read, the broker check, the
    jobs that count rows and repeated keys and check how evenly they are spread."""
    before_jobs: int
    publish_s: float
    """The publishing job, submitted to completed (any shuffle stage included)."""
    stage_s: float
    """Its last stage, the one whose tasks publish: submitted to completed."""
    tasks: int
    """Tasks of that stage: one connection each."""
    task_s: tuple[float, ...]
    """Each publishing task's duration."""
    after_s: float
    """The publishing job's completion to the clock's stop: gathering the results."""
    after_jobs: int


def _opt(value: Any) -> Any:
    return value.get() if value.isDefined() else None


def _seq(value: Any) -> list[Any]:
    return [value.apply(i) for i in range(value.size())]


def last_job_id(spark: Any) -> int:
    store = spark.sparkContext._jsc.sc().statusStore()
    return max((job.jobId() for job in _seq(store.jobsList(None))), default=-1)


def profile(spark: Any, after_job: int, started: float, stopped: float) -> SparkProfile | None:
    """The run's jobs (ids above ``after_job``) against its clock (epoch seconds);
    ``None`` when the status store does not tell (no publishing job, or still running
    5 s after the clock stopped)."""
    store = spark.sparkContext._jsc.sc().statusStore()
    deadline = time.monotonic() + 5.0
    while True:  # the listener bus is asynchronous: the last events may still be on it
        jobs = [j for j in _seq(store.jobsList(None)) if j.jobId() > after_job]
        done = all(_opt(j.completionTime()) is not None for j in jobs)
        if done or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    publishing = [j for j in jobs if (_opt(j.jobGroup()) or "").startswith(PUBLISH_GROUP)]
    if not done or len(publishing) != 1:
        return None
    (job,) = publishing
    submitted = _opt(job.submissionTime()).getTime() / 1000
    completed = _opt(job.completionTime()).getTime() / 1000
    stage = store.lastStageAttempt(max(_seq(job.stageIds())))
    stage_from, stage_to = _opt(stage.submissionTime()), _opt(stage.completionTime())
    tasks = _seq(store.taskList(stage.stageId(), stage.attemptId(), stage.numTasks() + 100))
    durations = tuple(_opt(t.duration()) / 1000 for t in tasks if _opt(t.duration()) is not None)
    return SparkProfile(
        elapsed=stopped - started,
        before_s=submitted - started,
        before_jobs=sum(1 for j in jobs if j.jobId() < job.jobId()),
        publish_s=completed - submitted,
        stage_s=(stage_to.getTime() - stage_from.getTime()) / 1000 if stage_to else 0.0,
        tasks=stage.numTasks(),
        task_s=durations,
        after_s=stopped - completed,
        after_jobs=sum(1 for j in jobs if j.jobId() > job.jobId()),
    )


def profile_lines(label: str, rows: int, run: SparkProfile, sync_rate: float | None) -> list[str]:
    """What one Spark run's profile says, measured figures only."""
    busy = sum(run.task_s)
    lines = [
        f"{label}: {rows / run.elapsed:,.0f} rows/s overall ({run.elapsed:.1f} s)",
        f"  before publishing {run.before_s:5.1f} s  ({run.before_jobs} Spark jobs: read, "
        "count rows and repeated keys, spread check; broker check)",
        f"  publishing job    {run.publish_s:5.1f} s  ({rows / run.publish_s:,.0f} rows/s); "
        f"its publishing stage {run.stage_s:.1f} s, {run.tasks} tasks = connections",
        f"  after publishing  {run.after_s:5.1f} s  ({run.after_jobs} Spark jobs: results "
        "gathered, summary)",
    ]
    if run.task_s and busy > 0:
        per_connection = rows / busy
        line = (
            f"  publishing tasks: {min(run.task_s):.1f} / {statistics.median(run.task_s):.1f}"
            f" / {max(run.task_s):.1f} s (min / median / max), on average "
            f"{busy / run.stage_s if run.stage_s else 0:.2f} running at once; "
            f"{per_connection:,.0f} rows/s per connection"
        )
        if sync_rate:
            line += f" ({per_connection / sync_rate:.2f}x sync publish_many's one connection)"
        lines.append(line)
    return lines


# The modes -----------------------------------------------------------------------------


def run_spark(spark: Any, url: str, topology: Topology, path: str, rows: int,
              partitions: int | None) -> tuple[float, SparkProfile | None]:
    """The clock around ``spark.read.parquet(path)`` and ``schedule``: the elapsed seconds
    and the run's profile (read after the clock stops; ``None`` if Spark does not tell)."""
    from delayq.spark import schedule

    after_job = last_job_id(spark)
    started_at = time.time()
    started = time.perf_counter()
    df = spark.read.parquet(path)
    summary = schedule(df, url=url, topology=topology, delay_col="delay", partitions=partitions)
    elapsed = time.perf_counter() - started
    if summary.total_published != rows or summary.total_rejected:
        raise RuntimeError(f"spark job published {summary.total_published} of {rows}")
    return elapsed, profile(spark, after_job, started_at, started_at + elapsed)


def ids(topology: Topology, rows: int) -> list[str]:
    return [key_message_id(topology.namespace, f"k{n}") for n in range(rows)]


def messages(topology: Topology, rows: int) -> list[Message]:
    """The rows as ``delayq.Message`` objects, the Spark job's ids (built before a clock)."""
    return [
        Message({"n": n}, ROUTING_KEY, DELAY, message_id=message_id)
        for n, message_id in enumerate(ids(topology, rows))
    ]


def run_async(url: str, topology: Topology, rows: int, window: int) -> float:
    batch = messages(topology, rows)
    queue = topology.tier_name(topology.ladder.tiers[0])

    async def go() -> float:
        async with AsyncPublisher(url, topology) as publisher:
            await publisher.connect()
            await publisher.publish_many(batch[:500])  # warm-up, same connection
            purge(url, queue)
            started = time.perf_counter()
            await publisher.publish_many(batch, window=window)
            return time.perf_counter() - started

    return asyncio.run(go())


def run_sync(url: str, topology: Topology, rows: int, window: int) -> float:
    """``delayq.sync.Publisher.publish_many``: the async mode's rows, one connection."""
    batch = messages(topology, rows)
    queue = topology.tier_name(topology.ladder.tiers[0])
    with Publisher(url, topology) as publisher:
        publisher.connect()
        publisher.publish_many(batch[:500])  # warm-up, same connection
        purge(url, queue)
        started = time.perf_counter()
        publisher.publish_many(batch, window=window)
        return time.perf_counter() - started


def run_raw(url: str, topology: Topology, rows: int, window: int) -> float:
    """Raw aio-pika: the same rows, headers and ids to the same tier exchange."""
    sample = MessageFactory(topology).build({"n": 0}, ROUTING_KEY, DELAY)
    message_ids = ids(topology, rows)
    queue = topology.tier_name(topology.ladder.tiers[0])
    timestamp = datetime.fromtimestamp(sample.timestamp_s, tz=timezone.utc)

    async def go() -> float:
        connection = await aio_pika.connect(url)
        async with connection:
            channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
            exchange = await channel.get_exchange(sample.exchange, ensure=False)
            slots = asyncio.Semaphore(window)

            async def publish_one(n: int) -> None:
                try:  # waits for the confirm; raises on a Basic.Return or Basic.Nack
                    await exchange.publish(
                        aio_pika.Message(
                            json.dumps({"n": n}, separators=(",", ":")).encode(),
                            headers=sample.headers,
                            content_type=sample.content_type,
                            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                            message_id=message_ids[n],
                            timestamp=timestamp,
                        ),
                        sample.routing_key,
                        mandatory=True,
                    )
                finally:
                    slots.release()

            async def publish(numbers: range) -> None:
                tasks = []
                for n in numbers:
                    await slots.acquire()
                    tasks.append(asyncio.create_task(publish_one(n)))
                await asyncio.gather(*tasks)

            await publish(range(min(500, rows)))  # warm-up, same connection
            purge(url, queue)
            started = time.perf_counter()
            await publish(range(rows))
            return time.perf_counter() - started

    return asyncio.run(go())


def session(master: str, conf: Sequence[tuple[str, str]]) -> Any:
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.appName("delayq-bench-schedule")
        .master(master)
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.ui.enabled", "false")  # --conf spark.ui.enabled=true to watch it
    )
    for key, value in conf:
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def splits(spark: Any, path: str) -> str:
    """How Spark reads ``path``: splits, and how many hold rows (untimed)."""
    sizes = spark.read.parquet(path).rdd.glom().map(len).collect()
    return f"{len(sizes)} splits, {sum(1 for s in sizes if s)} with rows"
