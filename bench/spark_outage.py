"""Issue 16's outage scenario, by hand: a broker stopped for 20 s in the middle of a
300,000-row ``delayq.spark.schedule`` job.

What it does, on a RabbitMQ node of its own (started here, stopped at the end):

1. the baseline (unless ``--no-baseline``): the same job with no outage, into its own
   namespace: rows per second;
2. the outage run: ``--rows`` rows (immediate, into the work queue) on ``local[2]``;
   once ``--stop-at`` of them are in the work queue the node is stopped (gracefully,
   data kept), kept down ``--down`` seconds, and started again. The job runs with
   ``retry_for`` ``--retry-for``;
3. a sync ``Consumer`` with an in-memory idempotency store drains the work queue.

It prints the job's exit (ok, or the error's first line), its time and rows/s beside the
baseline's and their ratio, the summary's published / retried / unconfirmed / rejected,
and the consumer's verdict: rows handled once, handled twice (must be 0), never handled
(must equal the unconfirmed), duplicates skipped.

Run it::

    python bench/spark_outage.py                        # 300,000 rows, 20 s down
    python bench/spark_outage.py --rows 50000 --down 10 --no-baseline

Progress goes to stderr, the figures to stdout.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from benchlib import load_average, log, positive_int, queue_depth

from delayq import RowsUnconfirmed, Settled, Topology
from delayq.local.node import LocalNode
from delayq.local.probes import tidy_epmd
from delayq.stores.memory import InMemoryStore
from delayq.sync import Consumer, apply_topology


def frame(spark: Any, rows: int) -> Any:
    from pyspark.sql import functions as F

    return spark.range(0, rows, numPartitions=2).select(
        F.concat(F.lit("k"), F.col("id").cast("string")).alias("key"),
        F.lit("job.a").alias("routing_key"),
        F.lit("0s").alias("delay"),
        F.struct(F.col("id").cast("long").alias("n")).alias("body"),
    )


def topology() -> Topology:
    ns = f"outage{uuid.uuid4().hex[:8]}"
    return Topology(
        namespace=ns,
        ladder=["1m"],
        destinations=[{"queue": f"{ns}.work", "bindings": ["job.#"]}],
    )


def run_job(spark: Any, url: str, topo: Topology, rows: int, retry_for: str) -> tuple[Any, str]:
    from delayq.spark import schedule

    try:
        summary = schedule(
            frame(spark, rows), url=url, topology=topo, delay_col="delay", retry_for=retry_for
        )
        return summary, "ok (exit 0)"
    except RowsUnconfirmed as exc:
        return exc.summary, f"RowsUnconfirmed (exit 1): {str(exc)[:160]}..."


class Drain:
    def __init__(self, url: str, topo: Topology) -> None:
        self.lock = threading.Lock()
        self.handled: Counter[int] = Counter()
        self.outcomes: Counter[str] = Counter()
        self.consumer = Consumer(
            url,
            topo,
            f"{topo.namespace}.work",
            self.handle,
            store=InMemoryStore(),
            prefetch=1000,
            observers=[self],
        )

    def handle(self, body: Any) -> None:
        with self.lock:
            self.handled[int(body["n"])] += 1

    def settled(self, event: Settled) -> None:
        with self.lock:
            self.outcomes[event.outcome] += 1

    def run_until_empty(self, url: str, queue: str) -> None:
        self.consumer.start()
        thread = threading.Thread(
            target=self.consumer.run, kwargs={"install_signal_handlers": False}, daemon=True
        )
        thread.start()
        quiet_since = None
        while True:
            time.sleep(1)
            if queue_depth(url, queue) == 0:
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since > 3:
                    break
            else:
                quiet_since = None
        self.consumer.request_stop()
        thread.join(60)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=positive_int, default=300_000)
    parser.add_argument("--down", type=float, default=20.0, help="seconds the node stays down")
    parser.add_argument("--stop-at", type=float, default=0.3, help="share of rows in first")
    parser.add_argument("--retry-for", default="60s")
    parser.add_argument("--no-baseline", action="store_true")
    args = parser.parse_args(argv)
    with tidy_epmd():
        return _run(args, argv or sys.argv[1:])


def _run(args: argparse.Namespace, argv: list[str]) -> int:
    from delayq.spark import local_session

    node = LocalNode()
    log("starting a RabbitMQ node ...")
    node.start()
    try:
        spark = local_session("local[2]", app_name="delayq outage bench", shuffle_partitions=4)
        spark.sparkContext.setLogLevel("ERROR")
        baseline_s = None
        if not args.no_baseline:
            topo = topology()
            apply_topology(topo, node.url)
            log(f"baseline: {args.rows:,} rows, no outage ...")
            began = time.monotonic()
            run_job(spark, node.url, topo, args.rows, args.retry_for)
            baseline_s = time.monotonic() - began

        topo = topology()
        apply_topology(topo, node.url)
        queue = f"{topo.namespace}.work"
        times: dict[str, float] = {}

        def outage() -> None:
            while queue_depth(node.url, queue) < args.rows * args.stop_at:
                time.sleep(0.2)
            times["stopping"] = time.monotonic()
            node.stop()
            times["down"] = time.monotonic()
            time.sleep(args.down)
            node.start()
            times["up"] = time.monotonic()

        log(f"outage run: {args.rows:,} rows, node stopped {args.down:g} s mid-job ...")
        stopper = threading.Thread(target=outage, daemon=True)
        began = time.monotonic()
        stopper.start()
        summary, verdict = run_job(spark, node.url, topo, args.rows, args.retry_for)
        job_s = time.monotonic() - began
        stopper.join(300)
        log("draining the work queue with a sync Consumer ...")
        drain = Drain(node.url, topo)
        drain.run_until_empty(node.url, queue)

        twice = sum(1 for c in drain.handled.values() if c > 1)
        never = args.rows - len(drain.handled)
        print(f"# {args.rows:,} rows on local[2], RabbitMQ node of this run; load {load_average()}")
        print(f"# {' '.join([Path(sys.argv[0]).name, *argv])}")
        print(f"job: {verdict}")
        if "down" in times:
            print(
                f"node: stop asked at {times['stopping'] - began:.1f} s, down "
                f"{times['down'] - began:.1f} s to {times['up'] - began:.1f} s "
                f"({times['up'] - times['down']:.1f} s without a broker)"
            )
            if times["up"] > began + job_s:
                print("note: the job ended before the node was back: the outage missed it")
        print(f"outage run: {job_s:.1f} s, {args.rows / job_s:,.0f} rows/s")
        if baseline_s is not None:
            print(
                f"baseline:   {baseline_s:.1f} s, {args.rows / baseline_s:,.0f} rows/s; "
                f"ratio outage/baseline time {job_s / baseline_s:.2f}"
            )
        print(
            f"summary: published {summary.total_published:,}, retried {summary.retried:,}, "
            f"unconfirmed {summary.total_unconfirmed:,}, rejected {summary.total_rejected:,}"
        )
        print(
            f"consumer: handled once {sum(1 for c in drain.handled.values() if c == 1):,}, "
            f"twice {twice:,}, never {never:,}, duplicates skipped "
            f"{drain.outcomes['duplicate']:,}"
        )
    finally:
        node.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
