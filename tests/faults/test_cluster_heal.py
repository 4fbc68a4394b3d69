"""The watchdog heals a tier whose dead-letter worker stopped, on a real 3-node cluster.

RabbitMQ 3.10.8's at-least-once dead-letter worker sometimes stops forwarding
after its queue's leader node is lost, but not in every run
(tests/faults/test_cluster_node_loss.py). To test the heal every time, this
scenario stops the worker itself: ``erlang:suspend_process`` on the dead-letter
workers of the node that leads the tiers (``rabbitmqctl eval``). Expired messages then stay in the
tier, neither ready nor unacknowledged, exactly as in the node-loss stall.

1. Without a remedy the watchdog reports the stall (``detected``) and nothing
   has reached the work queue.
2. With the remedy (``rabbitmqctl eval`` of ``transfer_leadership``) it moves the
   tier's leader to another node, whose new worker forwards every message.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from delayq import Message, Topology
from delayq.cli import main as cli_main
from delayq.local.cluster import LocalCluster
from delayq.ops.management import ManagementAPI
from delayq.ops.watchdog import HealOutcome, TransferLeadership, Watchdog
from delayq.sync import Publisher, apply_topology

pytestmark = [pytest.mark.faults, pytest.mark.cluster, pytest.mark.slow]

COUNT = 200
SUSPEND_WORKERS = (
    "Ws = [P || {_, P, _, _} <- supervisor:which_children(rabbit_fifo_dlx_sup), is_pid(P)], "
    "spawn(fun() -> [erlang:suspend_process(P) || P <- Ws], receive never -> ok end end), "
    "length(Ws)."
)
"""Suspends the node's dead-letter workers from a process that lives on (a suspension
ends with the process that made it, and ``eval``'s own process ends at once)."""


def _wait(check, timeout_s: float, every_s: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(every_s)
    return True


def _depths(cluster: LocalCluster, names: set[str]) -> dict[str, dict]:
    return {q["name"]: q for q in cluster.queues() if q["name"] in names}


def test_the_watchdog_finds_a_stopped_dead_letter_worker_and_moving_the_leader_heals_it(
    local_rabbitmq_cluster: LocalCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = local_rabbitmq_cluster
    ns = f"h{uuid.uuid4().hex[:10]}"
    work = f"{ns}.work"
    topology = Topology(
        namespace=ns, ladder=["1s", "5s"], destinations=[{"queue": work, "bindings": ["job.#"]}]
    )
    leader = cluster.nodes[0]
    apply_topology(topology, leader.url)  # declared through node 0: it leads every queue
    tier = topology.tier_name(topology.ladder.tiers[0])
    assert cluster.queue_leaders()[tier] == leader.name
    suspended = int(leader.ctl("eval", SUSPEND_WORKERS).strip())
    assert suspended >= 2, suspended  # a worker per queue that dead-letters at least once

    with Publisher(cluster.nodes[1].url, topology) as publisher:
        publisher.publish_many(
            [Message({"n": n}, "job.run", "1s", message_id=f"m{n}") for n in range(COUNT)]
        )

    apis = [ManagementAPI(url, timeout_s=3.0) for url in cluster.management_urls]
    # 1. Reported, not healed, and nothing moved.
    watching = Watchdog(topology, apis, threshold="4s", interval="1s")
    assert _wait(lambda: bool(watching.look()), 60, every_s=1.0), watching.detector.waiting()
    [found] = watching.events
    assert found.outcome is HealOutcome.DETECTED and found.stall.queue == tier
    assert found.stall.waiting == COUNT and found.stall.sample.leader == leader.name
    depths = _depths(cluster, {tier, work})
    assert depths[work]["messages"] == 0 and depths[tier]["messages"] == COUNT

    # 2. Healed: a new leader, a new worker, every message in the work queue.
    remedy = TransferLeadership(tuple(cluster.ctl_command()), erlang_cookie=cluster.cookie)
    healing = Watchdog(topology, apis, threshold="4s", interval="1s", remedy=remedy)
    stop = threading.Event()
    thread = threading.Thread(target=healing.run, args=(stop,), daemon=True)
    thread.start()
    try:
        arrived = _wait(lambda: _depths(cluster, {work})[work]["messages"] == COUNT, 90)
    finally:
        stop.set()
        thread.join(30)
    events = [e for e in healing.events if e.stall.queue == tier]
    assert arrived, (healing.events, _depths(cluster, {tier, work}))
    assert events and events[0].outcome is HealOutcome.HEALED, healing.events
    assert events[0].target in {n.name for n in cluster.nodes[1:]}
    assert cluster.queue_leaders()[tier] != leader.name
    assert _wait(lambda: _depths(cluster, {tier})[tier]["messages"] == 0, 30)

    # 3. `delayq stats` and `topology verify` through a URL of the three nodes: each call
    # reaches one at random, whose cluster_name (never set) is its own node's name, and the
    # API answers as node 0. Before, 2 calls of 3 refused the API as another cluster's.
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(topology.model_dump(mode="json")))
    hosts = ",".join(urlsplit(node.url).netloc.rpartition("@")[2] for node in cluster.nodes)
    url = f"amqp://guest:guest@{hosts}/"
    common = ["--file", str(path), "--url", url, "--management-url", cluster.management_urls[0]]
    for _ in range(20):
        assert cli_main(["stats", *common]) == 0, capsys.readouterr().err
        assert cli_main(["topology", "verify", *common]) == 0, capsys.readouterr().err
    assert "answers for cluster" not in capsys.readouterr().err
