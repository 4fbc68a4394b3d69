"""Wall time of RocketMQ's 16-retry schedule (4 h 45 m 40 s of virtual time) on the memory broker.

A handler that always fails, consumed by delayq's ``Consumer`` on a
``MemoryBroker`` whose ladder holds RocketMQ's delays: 17 attempts, then the
DLQ. Prints the virtual time covered and the wall time it took (median of
``--runs``), for the README; no test asserts on it.

    PYTHONPATH=src python bench/memory_schedule.py --runs 20
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from typing import Any

from delayq import Topology
from delayq.consume.retry import ROCKETMQ_SCHEDULE, ScheduleBackoff
from delayq.testing import MemoryBroker


def one_run() -> tuple[float, int, int]:
    topology = Topology(
        namespace="rocket",
        ladder=ROCKETMQ_SCHEDULE,
        destinations=[{"queue": "orders", "bindings": ["order.#"]}],
    )
    started = time.perf_counter()
    with MemoryBroker() as broker:
        attempts = 0

        def always_fails(body: Any) -> None:
            nonlocal attempts
            attempts += 1
            raise ConnectionError("payment gateway down")

        broker.consumer(
            topology, "orders", always_fails, policy=ScheduleBackoff.of(ROCKETMQ_SCHEDULE)
        )
        broker.publisher(topology).publish({"order": 42}, "order.pay", "0s")
        if not broker.run_until_idle(max="6h") or len(broker.dlq("orders")) != 1:
            raise SystemExit("the schedule did not end in the DLQ")
        return time.perf_counter() - started, broker.elapsed_ms, attempts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    logging.getLogger("delayq").setLevel(logging.ERROR)  # one dead-letter warning per run
    results = [one_run() for _ in range(max(1, args.runs))]
    walls = sorted(r[0] for r in results)
    _, virtual_ms, attempts = results[0]
    print(
        f"{attempts} attempts over {virtual_ms / 1000:.0f} s of virtual time "
        f"({virtual_ms / 3_600_000:.2f} h); wall time per run: median "
        f"{statistics.median(walls) * 1000:.1f} ms, max {walls[-1] * 1000:.1f} ms "
        f"({len(walls)} runs; the first includes imports warming up)"
    )
    median_s = statistics.median(walls)
    print(
        f"virtual time / wall time: {virtual_ms / 1000 / median_s:,.0f}x "
        f"(on a real broker the same schedule takes {virtual_ms / 3_600_000:.2f} h of waiting)"
    )


if __name__ == "__main__":
    main()
