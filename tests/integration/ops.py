"""Helpers for the operations tests (verify, stats, grant) on nodes they control."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

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


def management(node: LocalNode, method: str, path: str, body: object = None) -> Any:
    """``method`` ``/api`` + ``path`` on ``node``'s management API as guest: the tests' own
    user admin, where a ``rabbitmqctl`` call is an Erlang VM of its own (0.7-1.1 s of CPU)."""
    assert node.management_port is not None, "a node started with management=True"
    request = urllib.request.Request(
        f"http://127.0.0.1:{node.management_port}/api{path}",
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={
            "Authorization": "Basic " + base64.b64encode(b"guest:guest").decode(),
            "Content-Type": "application/json",
        },
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        payload = response.read()
    return json.loads(payload) if payload else None


def add_user(node: LocalNode, name: str, password: str) -> None:
    """A user with no tags (``rabbitmqctl add_user``); an existing one gets ``password``
    and keeps its permissions (``rabbitmqctl change_password``)."""
    management(node, "PUT", f"/users/{urllib.parse.quote(name, safe='')}",
               {"password": password, "tags": ""})


def delete_user(node: LocalNode, name: str) -> None:
    """Delete the user ``name``; nothing if there is none."""
    try:
        management(node, "DELETE", f"/users/{urllib.parse.quote(name, safe='')}")
    except urllib.error.HTTPError as exc:
        if exc.code != 404:
            raise


def set_permissions(node: LocalNode, user: str, configure: str, write: str, read: str) -> None:
    """``user``'s permissions on the default vhost (``rabbitmqctl set_permissions``)."""
    management(node, "PUT", f"/permissions/%2F/{urllib.parse.quote(user, safe='')}",
               {"configure": configure, "write": write, "read": read})


def user_permissions(node: LocalNode, user: str) -> list[tuple[str, str, str, str]]:
    """``(vhost, configure, write, read)`` of each vhost ``user`` has permissions on."""
    rows = management(node, "GET", f"/users/{urllib.parse.quote(user, safe='')}/permissions")
    return sorted((r["vhost"], r["configure"], r["write"], r["read"]) for r in rows)


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
