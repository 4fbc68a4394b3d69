"""Helpers for the operations tests (verify, stats, grant) on nodes they control."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pika

from delayq import Publisher, Topology
from delayq.local.node import LocalNode
from delayq.ops.management import ManagementAPI


def delayq(
    *args: str, env: dict[str, str] | None = None, timeout: float = 90
) -> subprocess.CompletedProcess[str]:
    """Run the CLI through this interpreter, with no management URL from the environment."""
    environment = dict(env if env is not None else os.environ)
    for name in ("DELAYQ_MANAGEMENT_URL", "DELAYQ_URL"):
        environment.pop(name, None)
    return subprocess.run(
        [sys.executable, "-m", "delayq", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=environment,
    )


def queue_names(node: LocalNode) -> set[str]:
    out = node.ctl("list_queues", "name", "--no-table-headers", "--quiet")
    return {line.strip() for line in out.splitlines() if line.strip()}


def rows(output: str) -> dict[str, tuple[str, str]]:
    """The verify table as {check: (status, detail)}."""
    table: dict[str, tuple[str, str]] = {}
    for line in output.splitlines():
        status, _, rest = line.partition(" ")
        if status in ("OK", "FAIL", "SKIPPED"):
            subject, _, detail = rest.strip().partition("  ")
            table[subject.strip()] = (status, detail.strip())
    return table


def stall_1s_tier(node: LocalNode, topology: Topology, count: int) -> None:
    """``count`` dead letters held by ``<ns>.tier.1s`` with nowhere to go: published with
    a 1 s delay, then the ready exchange deleted before they expire (a quorum tier keeps
    them, at-least-once). Apply the topology again to give them their target back."""
    with Publisher(node.url, topology) as publisher:
        for n in range(count):
            publisher.publish({"n": n}, "job.later", "1s")
    connection = pika.BlockingConnection(pika.URLParameters(node.url))
    try:
        connection.channel().exchange_delete(topology.ready_exchange)
    finally:
        connection.close()
    if node.management_url is not None:  # until the API's counts show them all held
        api = ManagementAPI(node.management_url)
        name = f"{topology.namespace}.tier.1s"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            row = api.queue(topology.vhost, name) or {}
            held = row.get("messages", 0) - row.get("messages_ready", 0)
            if held - row.get("messages_unacknowledged", 0) == count:
                return
            time.sleep(0.2)
        raise AssertionError(f"{name} does not show {count} dead letters held: {row}")
