"""A failed ``topology apply`` leaves nothing half-applied, and no publisher confirms into it.

Issue 12, item 2: a tier queue already existed with ``x-overflow: drop-head`` and no
dead-letter exchange; ``apply`` exited 1 but created the other entities, and
``delayq publish -d 5s`` then exited 0 with a broker confirm: the message was gone
5 s later. Now ``apply`` checks every entity before declaring any, and a publisher
checks the apply marker a completed apply leaves (see ``delayq.topology.marker``).
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pika.exceptions as pex
import pytest
import yaml

from delayq import (
    ApplyStatus,
    Message,
    Topology,
    TopologyConflict,
    TopologyNotApplied,
    build_declarations,
)
from delayq.topology.declarations import BindingDecl

DROP_HEAD = {"x-queue-type": "quorum", "x-overflow": "drop-head", "x-message-ttl": 5000}
"""The issue's tier queue: drops instead of rejecting, and dead-letters nowhere."""


@contextlib.contextmanager
def channel(url: str) -> Iterator[Any]:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        yield connection.channel()
    finally:
        connection.close()


def existing(url: str, topology: Topology) -> set[str]:
    """The exchanges and queues of ``topology`` that exist (passive declares)."""
    found: set[str] = set()
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        for decl in build_declarations(topology):
            if isinstance(decl, BindingDecl):
                continue
            chan = connection.channel()
            try:
                if decl.kind == "exchange":
                    chan.exchange_declare(decl.name, passive=True)
                else:
                    chan.queue_declare(decl.name, passive=True)
                found.add(f"{decl.kind} {decl.name}")
                chan.close()
            except pex.ChannelClosedByBroker as exc:
                assert exc.reply_code == 404
    finally:
        connection.close()
    return found


def depth(url: str, queue: str) -> int:
    with channel(url) as chan:
        return int(chan.queue_declare(queue, passive=True).method.message_count)


def the_issues_tier(url: str, topology: Topology) -> str:
    tier = topology.tier_name(topology.ladder.tiers[-1])  # the 5s tier
    with channel(url) as chan:
        chan.queue_declare(tier, durable=True, arguments=DROP_HEAD)
    return tier


def test_a_failed_apply_declares_nothing_and_publishers_refuse_to_confirm(
    driver, make_topology, rabbitmq_url, collect
):
    topo = make_topology(["1s", "5s"])
    tier = the_issues_tier(rabbitmq_url, topo)

    with pytest.raises(TopologyConflict) as caught:
        driver.apply(topo)
    assert caught.value.name == tier
    assert existing(rabbitmq_url, topo) == {f"queue {tier}"}  # nothing else was declared

    with pytest.raises(TopologyNotApplied, match="Run `delayq topology apply`") as refused:
        driver.publish(topo, b"lost?", "job.a", "5s")
    assert "Nothing was sent" in str(refused.value)
    with pytest.raises(TopologyNotApplied):
        driver.publish(topo, b"lost?", "job.a", "1s")
    with pytest.raises(TopologyNotApplied):
        driver.publish_many(topo, [Message(b"lost?", "job.a", "5s") for _ in range(3)])
    assert depth(rabbitmq_url, tier) == 0

    # Fixed by hand and applied: the same publisher sends, and it arrives.
    with channel(rabbitmq_url) as chan:
        chan.queue_delete(tier)
    assert driver.apply(topo).ok
    inbox = collect(f"{topo.namespace}.work")
    receipt = driver.publish(topo, b"now", "job.a", "1s")
    [arrival] = inbox.wait(1, timeout_s=10)
    assert arrival.message_id == receipt.message_id


def test_the_cli_sequence_of_the_issue(make_topology, rabbitmq_url, tmp_path: Path):
    topo = make_topology(["1s", "5s"])
    tier = the_issues_tier(rabbitmq_url, topo)
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(topo.model_dump(mode="json")))

    def delayq(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "delayq", *args, "--file", str(path), "--url", rabbitmq_url],
            capture_output=True,
            text=True,
            timeout=60,
        )

    applied = delayq("topology", "apply")
    assert applied.returncode == 1, applied.stdout + applied.stderr
    assert f"! conflict queue    {tier} [tier]" in applied.stdout
    assert "x-overflow" in applied.stdout or "x-dead-letter" in applied.stdout
    assert "1 conflicting entity was left unchanged and nothing else was declared" in (
        applied.stderr
    )
    assert " created" not in applied.stdout and "- skipped" in applied.stdout
    assert existing(rabbitmq_url, topo) == {f"queue {tier}"}

    published = delayq("publish", "-k", "job.a", "-d", "5s")
    assert published.returncode == 1, published.stdout
    assert published.stdout == ""  # no receipt
    assert published.stderr.startswith("delayq: error: namespace ")
    assert "Run `delayq topology apply`" in published.stderr
    assert depth(rabbitmq_url, tier) == 0


def test_a_conflict_found_later_withdraws_the_marker_from_new_publishers(
    driver_for, make_topology, rabbitmq_url
):
    topo = make_topology(["1s", "5s"])
    first = driver_for(rabbitmq_url)
    assert first.apply(topo).ok
    first.publish(topo, b"fine", "job.a", "1s")
    # Someone replaces a tier by hand with the issue's queue; the next apply (a
    # consumer starting, an operator) finds it.
    tier = topo.tier_name(topo.ladder.tiers[-1])
    with channel(rabbitmq_url) as chan:
        chan.queue_delete(tier)
        chan.queue_declare(tier, durable=True, arguments=DROP_HEAD)
    report = first.apply(topo, raise_on_conflict=False)
    assert [c.name for c in report.conflicts] == [tier] and report.marker_removed
    assert report.count(ApplyStatus.PRESENT) > 0 and report.count(ApplyStatus.CREATED) == 0
    with pytest.raises(TopologyNotApplied):
        driver_for(rabbitmq_url).publish(topo, b"lost?", "job.a", "5s")
    assert depth(rabbitmq_url, tier) == 0


def test_send_many_refuses_before_settling_anything(make_topology, rabbitmq_url):
    """The stream behind Spark schedules: its connection checks the marker too."""
    from delayq.sync import Publisher, apply_topology

    topo = make_topology(["1s", "5s"])
    tier = the_issues_tier(rabbitmq_url, topo)
    with pytest.raises(TopologyConflict):
        apply_topology(topo, rabbitmq_url)
    settled: list[Any] = []
    with Publisher(rabbitmq_url, topo) as pub, pytest.raises(TopologyNotApplied):
        pub.send_many(
            (pub.factory.build(b"x", "job.a", "5s") for _ in range(10)),
            settle=lambda *args: settled.append(args),
        )
    assert settled == [] and depth(rabbitmq_url, tier) == 0


def test_apply_and_delete_of_a_fresh_namespace_log_no_warning_of_pika(
    make_topology, rabbitmq_url, caplog: pytest.LogCaptureFixture
):
    """Applying to a fresh namespace probes entities that are not there yet (passive
    declares answered 404): expected, so pika's warning of each closed channel is not
    logged; a 404 of anything else still is."""
    from delayq.sync import apply_topology, delete_topology

    topology = make_topology()
    with caplog.at_level(logging.INFO, logger="pika"):
        apply_topology(topology, rabbitmq_url)
        delete_topology(topology, rabbitmq_url)
    noisy = [
        r for r in caplog.records if r.name.startswith("pika") and r.levelno >= logging.WARNING
    ]
    assert noisy == []
    assert not [r for r in caplog.records if str(r.msg).startswith("Created channel")]

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="pika"), channel(rabbitmq_url) as chan:
        with pytest.raises(pex.ChannelClosedByBroker):
            chan.queue_declare(topology.namespace + ".nowhere", passive=True)
    assert [r.args[0] for r in caplog.records if r.name == "pika.channel"] == [404]
