"""Misuse of the paths around the core: parked-message replay, delivery records, bulk-job
tolerances. Each asserts a clear delayq error or a correct outcome, and that nothing
confirmed or parked is lost. (The Spark ones that need a session are in tests/spark.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
import yaml

from delayq import ConnectionFailed, InvalidInput, Message, Topology
from delayq.local.node import LocalNode
from delayq.message.bulk import RejectionLimit
from delayq.ops.parked import H_REPLAYED_AT
from delayq.sync import Publisher, apply_topology, parking
from tests.amqp import depth
from tests.waiting import wait_for

# --- helpers --------------------------------------------------------------------------------


def delayq(path: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "delayq", *args, "--file", str(path), "--url", url],
        capture_output=True,
        text=True,
        timeout=120,
    )


def write(topology: Topology, tmp_path: Path) -> Path:
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(topology.model_dump(mode="json")))
    return path


def park(url: str, queue: str, ids: list[str], routing_key: str = "job.x") -> None:
    """Put messages straight into a parking queue, as a consumer's dead-lettering would."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        for message_id in ids:
            channel.basic_publish(
                "",
                queue,
                json.dumps({"id": message_id}).encode(),
                pika.BasicProperties(
                    message_id=message_id,
                    content_type="application/json",
                    delivery_mode=2,
                    headers={"delayq-routing-key": routing_key},
                ),
                mandatory=True,
            )
    finally:
        connection.close()


def drain(url: str, queue: str) -> list[dict[str, Any]]:
    """Take every message of ``queue``: id and headers."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    taken: list[dict[str, Any]] = []
    try:
        channel = connection.channel()
        while True:
            method, props, _ = channel.basic_get(queue, auto_ack=True)
            if method is None:
                return taken
            taken.append({"id": props.message_id, "headers": dict(props.headers or {})})
    finally:
        connection.close()


def dlq_target(queue: str) -> Any:
    return lambda parked: ("", queue)


@pytest.fixture
def node_topology(local_rabbitmq_node: LocalNode) -> Iterator[Any]:
    """Topologies on this worker's own local node (a test here closes its connections)."""
    from tests.topologies import throwaway_topologies

    with throwaway_topologies(local_rabbitmq_node.url, prefix="m", ladder=("1s",)) as make:
        yield make


# --- replay -----------------------------------------------------------------------------------


def test_unrouted_replay_of_a_key_still_unbound_is_not_counted_as_replayed(
    make_topology: Any, rabbitmq_url: str, tmp_path: Path
) -> None:
    topo = make_topology(["1s"])
    apply_topology(topo, rabbitmq_url)
    park(rabbitmq_url, topo.unrouted, ["u-1", "u-2"], routing_key="nobody.yet")
    park(rabbitmq_url, topo.unrouted, ["u-3"], routing_key="job.bound")
    run = delayq(write(topo, tmp_path), rabbitmq_url, "unrouted", "replay", "--all")
    # Before: "replayed 3 of 3", exit 0, while two went straight back to <ns>.unrouted.
    assert run.returncode == 1, run.stdout + run.stderr
    assert "2 came straight back" in run.stderr and "u-1" in run.stderr
    wait_for(lambda: depth(rabbitmq_url, f"{topo.namespace}.work") == 1, 10, "u-3 in work")
    parked = drain(rabbitmq_url, topo.unrouted)
    assert sorted(p["id"] for p in parked) == ["u-1", "u-2"]  # still parked, nothing lost


def test_unrouted_replay_api_reports_what_came_back(
    make_topology: Any, rabbitmq_url: str
) -> None:
    topo = make_topology(["1s"])
    apply_topology(topo, rabbitmq_url)
    park(rabbitmq_url, topo.unrouted, ["a", "b"], routing_key="nobody.yet")
    report = parking.replay(
        rabbitmq_url,
        topo.unrouted,
        topo,
        target=lambda p: (topo.ready_exchange, p.delivery.origin_routing_key),
        ids=["a"],
    )
    assert (report.replayed, report.returned, report.missing) == ([], ["a"], [])
    parked = {p["id"]: p for p in drain(rabbitmq_url, topo.unrouted)}
    assert sorted(parked) == ["a", "b"] and H_REPLAYED_AT in parked["a"]["headers"]


def test_dlq_replay_to_a_deleted_queue_fails_and_keeps_the_message_parked(
    make_topology: Any, rabbitmq_url: str, tmp_path: Path
) -> None:
    topo = make_topology(["1s"])
    apply_topology(topo, rabbitmq_url)
    work = f"{topo.namespace}.work"
    park(rabbitmq_url, f"{work}.dlq", ["d-1"])
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    connection.channel().queue_delete(work)  # the destination went away meanwhile
    connection.close()
    run = delayq(write(topo, tmp_path), rabbitmq_url, "dlq", "replay", work, "--all")
    assert run.returncode == 1 and "no queue bound" in run.stderr, run.stderr
    assert [p["id"] for p in drain(rabbitmq_url, f"{work}.dlq")] == ["d-1"]


@pytest.mark.parametrize("rate", [0, -5.0, float("nan"), float("inf"), 1e-300])
def test_a_replay_rate_that_is_no_rate_is_refused_before_anything_moves(
    make_topology: Any, rabbitmq_url: str, rate: float
) -> None:
    # Before: 0 and negative rates meant "no limit" (NaN too): a replay meant to trickle
    # ran flat out into a handler that had just recovered.
    topo = make_topology(["1s"])
    apply_topology(topo, rabbitmq_url)
    work = f"{topo.namespace}.work"
    park(rabbitmq_url, f"{work}.dlq", ["r-1", "r-2"])
    with pytest.raises(InvalidInput, match=r"rate .*(above 0|slower than one message a day)"):
        parking.replay(rabbitmq_url, f"{work}.dlq", topo, target=dlq_target(work), rate_per_s=rate)
    assert depth(rabbitmq_url, f"{work}.dlq") == 2 and depth(rabbitmq_url, work) == 0


def test_a_replay_cut_by_a_lost_connection_raises_a_delayq_error_and_loses_nothing(
    local_rabbitmq_node: LocalNode, node_topology: Any
) -> None:
    url = local_rabbitmq_node.url
    topo = node_topology()
    apply_topology(topo, url)
    work = f"{topo.namespace}.work"
    ids = [f"c-{n}" for n in range(6)]
    park(url, f"{work}.dlq", ids)

    def cut(done: int, total: int) -> None:
        if done == 2:
            local_rabbitmq_node.ctl("close_all_connections", "delayq replay test", check=False)

    # Before: pika's ConnectionClosedByBroker escaped (a traceback from the CLI).
    with pytest.raises(ConnectionFailed, match=r"while replaying .* 2 were replayed"):
        parking.replay(url, f"{work}.dlq", topo, target=dlq_target(work), progress=cut)
    wait_for(lambda: depth(url, work) >= 2, 10, "the replayed copies in work")
    replayed = {p["id"] for p in drain(url, work)}
    still_parked = {p["id"] for p in drain(url, f"{work}.dlq")}
    assert replayed | still_parked == set(ids)  # each replayed, or still parked (or both)


def test_a_replay_interrupted_mid_way_leaves_the_rest_parked_and_a_second_finishes(
    make_topology: Any, rabbitmq_url: str, tmp_path: Path
) -> None:
    topo = make_topology(["1s"])
    apply_topology(topo, rabbitmq_url)
    work = f"{topo.namespace}.work"
    ids = [f"i-{n}" for n in range(5)]
    park(rabbitmq_url, f"{work}.dlq", ids)

    def interrupt(done: int, total: int) -> None:
        if done == 2:
            raise KeyboardInterrupt  # Ctrl-C

    with pytest.raises(KeyboardInterrupt):
        parking.replay(rabbitmq_url, f"{work}.dlq", topo, target=dlq_target(work),
                       progress=interrupt)
    assert depth(rabbitmq_url, f"{work}.dlq") == 3
    # The same ids again: two are gone (replayed), so they are "not found": exit 1
    again = delayq(write(topo, tmp_path), rabbitmq_url, "dlq", "replay", work,
                   *[arg for i in ids for arg in ("--id", i)])
    assert again.returncode == 1 and "not found" in again.stderr, again.stderr
    wait_for(lambda: depth(rabbitmq_url, work) == 5, 10, "all five in work")
    assert sorted(p["id"] for p in drain(rabbitmq_url, work)) == ids  # each once
    assert depth(rabbitmq_url, f"{work}.dlq") == 0


# --- bulk-job tolerance (pure: refused before Spark starts) -----------------------------------


@pytest.mark.parametrize(
    "value", [0.01, "0.5", -1, "-1", True, "150%", "x%", "lots", float("nan")]
)
def test_an_ambiguous_or_impossible_rejection_limit_is_refused(value: object) -> None:
    with pytest.raises(InvalidInput, match="max_rejected"):
        RejectionLimit.parse(value)


def test_rejection_limits_count_rows_or_a_share_of_them() -> None:
    assert RejectionLimit.parse("5").exceeded(rejected=6, rows=1000)
    assert not RejectionLimit.parse(5).exceeded(rejected=5, rows=5)
    assert not RejectionLimit.parse("1%").exceeded(rejected=10, rows=1000)
    assert RejectionLimit.parse("1%").exceeded(rejected=11, rows=1000)
    assert RejectionLimit.parse("0%").exceeded(rejected=1, rows=10**9)


def test_spark_schedule_refuses_a_bare_fraction_before_starting_spark(tmp_path: Path) -> None:
    source = tmp_path / "rows.jsonl"
    source.write_text('{"key": 1, "routing_key": "job.a", "delay": "1s"}\n')
    base = [sys.executable, "-m", "delayq", "spark", "schedule", str(source), "--delay-col",
            "delay", "--url", "amqp://guest:guest@127.0.0.1:1/"]
    started = time.monotonic()
    run = subprocess.run([*base, "--max-rejected", "0.5"], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 2 and "a bare fraction is ambiguous" in run.stderr, run.stderr
    assert time.monotonic() - started < 60  # no Spark session was started for it
    both = subprocess.run([*base, "--max-rejected", "1", "--allow-rejected"],
                          capture_output=True, text=True, timeout=120)
    assert both.returncode == 2 and "is not allowed with" in both.stderr
    # A typo'd input: before, Spark started and died with an AnalysisException traceback
    base[5] = str(tmp_path / "rows.jsonl.typo")
    typo = subprocess.run(base, capture_output=True, text=True, timeout=120)
    assert typo.returncode == 2 and "no input at" in typo.stderr, typo.stderr
    assert "Traceback" not in typo.stderr


# --- delivery records -------------------------------------------------------------------------

APP = """
import json
from pathlib import Path
from delayq import Worker, load_topology

worker = Worker(load_topology(Path(__file__).with_name("topology.yaml")))
OUT = Path(__file__).with_name("effects.jsonl")

@worker.handler("{ns}.work")
def plain(value):
    with OUT.open("a") as out:
        out.write(json.dumps(value) + "\\n")
"""


def test_a_worker_whose_records_cannot_be_written_keeps_delivering_and_exits_1(
    make_topology: Any, rabbitmq_url: str, tmp_path: Path
) -> None:
    topo = make_topology(["1s"])
    (tmp_path / "topology.yaml").write_text(yaml.safe_dump(topo.model_dump(mode="json")))
    (tmp_path / "app.py").write_text(textwrap.dedent(APP).replace("{ns}", topo.namespace))
    apply_topology(topo, rabbitmq_url)
    records = tmp_path / "records"
    effects = tmp_path / "effects.jsonl"

    def handled() -> int:
        return len(effects.read_text().splitlines()) if effects.exists() else 0

    proc = subprocess.Popen(
        [sys.executable, "-m", "delayq", "worker", "app:worker", "--url", rabbitmq_url,
         "--records", str(records), "--records-max-bytes", "1024", "--log-level", "warning"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        with Publisher(rabbitmq_url, topo) as pub:
            pub.publish_many([Message({"n": n}, "job.a", "0s") for n in range(5)])
            wait_for(lambda: handled() == 5, 30, "the first five handled")
            wait_for(lambda: any(records.glob("*.jsonl")), 10, "a records file")
            # The disk under the records goes away. Moved aside in one step: an rmtree
            # raced the worker writing its next file there (ENOTEMPTY in CI).
            records.rename(tmp_path / "records-gone")
            records.write_text("a file where the directory was")
            pub.publish_many([Message({"n": n}, "job.a", "0s") for n in range(5, 25)])
            wait_for(lambda: handled() == 25, 30, "every message handled all the same")
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    # Before: exit 0 and one log line; the records of 20+ deliveries were gone unsaid.
    assert proc.returncode == 1, output
    assert "delivery records were not written" in output
    assert "cannot write to" in output  # logged when it happened, not only at the stop


# --- demo ---------------------------------------------------------------------------------------


def test_the_demo_refuses_fewer_messages_than_it_needs_instead_of_sending_others(
    rabbitmq_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from delayq.cli import main

    # Before: --messages 1 published 2 (a 20 s and a 1 s one) and said "2/2 arrived".
    assert main(["demo", "--messages", "1", "--url", rabbitmq_url]) == 2
    assert "needs at least 2 messages" in capsys.readouterr().err


# --- stats ------------------------------------------------------------------------------------


def test_stats_of_a_queue_the_management_api_has_not_sampled_yet_are_not_zero() -> None:
    """A queue declared since the API's last statistics sample has no counts there yet:
    before, `delayq stats` showed 0 messages for it (here for a whole minute)."""
    from delayq.ops.management import ManagementAPI
    from delayq.sync.depths import queue_depths

    with LocalNode(management=True, config={"collect_statistics_interval": "60000"}) as node:
        assert node.management_url is not None
        connection = pika.BlockingConnection(pika.URLParameters(node.url))
        try:
            channel = connection.channel()
            channel.confirm_delivery()
            channel.queue_declare("fresh", durable=True)
            for _ in range(5):
                channel.basic_publish("", "fresh", b"x", mandatory=True)
            depths, source = queue_depths(
                ["fresh", "absent"], node.url, management=ManagementAPI(node.management_url)
            )
        finally:
            connection.close()
    assert source.startswith("management API")
    fresh = depths["fresh"]
    assert fresh is not None and (fresh.ready, fresh.unacked) == (5, None)  # unacked unknown
    assert depths["absent"] is None
