"""A Spark task that cannot open the job's schedule index (a SQLite file locked by
another process, a path it cannot open) sends nothing and says so in its output: one
unconfirmed row each with the cause and one ``failed`` line, as for a broker that
refused for good. An outside tester's locked index made the task raise, and Spark failed
the whole job with pages of traces, no summary and no errors output. Run as Spark runs
it, without a session: no broker is reached (nothing is sent). In tests/spark, so a
missing PySpark fails in CI instead of skipping."""

from __future__ import annotations

from pathlib import Path

from delayq import Topology
from delayq.spark._resilient import RetryPolicy
from delayq.spark._schedule_task import FAILED, UNCONFIRMED, publish_partition

TOPO = Topology(namespace="shop", ladder=["1m"], external_bindings=("#",))


def test_a_task_that_cannot_open_the_index_sends_nothing_and_says_why(tmp_path: Path) -> None:
    where = tmp_path / "not-a-file"
    where.mkdir()  # a directory where the index should be: it cannot be opened
    run = publish_partition(
        "amqp://guest:guest@127.0.0.1:1/",  # never reached: nothing is sent
        TOPO.model_dump(mode="json"),
        window=10,
        body_json=False,
        policy=RetryPolicy.parse("1s", "100ms"),
        job="j",
        schedule_index=str(where),
    )
    rows = [(f"k{i}", "job.a", "30s", None, None, "{}", None) for i in range(3)]
    out = list(run(iter(rows)))
    unconfirmed = [line for line in out if line[0] == UNCONFIRMED]
    failed = [line for line in out if line[0] == FAILED]
    assert [line[1] for line in unconfirmed] == ["k0", "k1", "k2"], out
    assert len(failed) == 1 and failed[0][5] == "StoreError", failed
    assert all("not sent, the schedule index failed" in str(line[6]) for line in unconfirmed)
