"""A throwaway RabbitMQ cluster of local nodes, for fault tests and trying a cluster out.

Each node is a :class:`~delayq.local.node.LocalNode` (own ports, own data folder,
name ``delayq-<port>@localhost``); they share one Erlang cookie, and every node
after the first joins the first (``stop_app``, ``join_cluster``, ``start_app``).
Quorum queues declared on it get a member on each node (RabbitMQ's default
initial group size is 3, ``quorum_cluster_size``), led by the node of the
connection that declared them (the default ``client-local`` leader locator).

>>> with LocalCluster(3) as cluster:                  # doctest: +SKIP
...     print(cluster.url)      # amqp://guest:guest@127.0.0.1:<p1>,127.0.0.1:<p2>,.../
...     leader = cluster.node_named(cluster.queue_leaders()["orders"])
...     cluster.stop_node(leader)                     # the queue elects a new leader
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from delayq.local.node import LocalNode, LocalNodeError, port_open
from delayq.local.reaper import unwatch, watch

__all__ = ["LocalCluster"]


def _in_parallel(nodes: list[LocalNode], action: Callable[[LocalNode], object]) -> None:
    """Run ``action`` on every node at once (a node takes seconds to start or stop)."""
    errors: list[BaseException] = []

    def run(node: LocalNode) -> None:
        try:
            action(node)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(node,), daemon=True) for node in nodes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


class _Epmd:
    """The epmd the nodes of a cluster running in a tree share (a node's own would end
    with that node, and the others would lose their names): started before them, in a
    PID namespace of its own, stopped by its PID after them."""

    def __init__(self, node: LocalNode) -> None:
        self._node = node
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        node, port = self._node, str(self._node.epmd_port)
        argv = node.server.command(
            "/usr/bin/epmd", ["-port", port, "-address", "127.0.0.1"], own_pids=True
        )
        self._process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        watch(self._process.pid)
        deadline = time.monotonic() + 30
        while not port_open(int(port)):
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise LocalNodeError(f"epmd did not listen on port {port}")
            time.sleep(0.1)

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)  # unshare: its namespace ends with it
            process.wait(timeout=10)
        if process is not None:
            unwatch(process.pid)


class LocalCluster:
    """``size`` local nodes joined into one cluster; :meth:`cleanup` stops them all and
    deletes their data folders (if the cluster made ``base_dir``)."""

    def __init__(
        self,
        size: int = 3,
        base_dir: str | Path | None = None,
        *,
        config: Mapping[str, str] | None = None,
        advanced_config: str | None = None,
        management: bool = False,
        server: str | None = None,
    ) -> None:
        if size < 1:
            raise ValueError(f"a cluster needs at least one node, not {size}")
        self._own_dir = base_dir is None
        self.base_dir = Path(base_dir or tempfile.mkdtemp(prefix="delayq-cluster-"))
        cookie = secrets.token_hex(20).upper()
        self.cookie = cookie
        """The Erlang cookie the nodes share (what ``rabbitmqctl --erlang-cookie`` takes)."""
        first = LocalNode(
            self.base_dir / "node0",
            config=config,
            advanced_config=advanced_config,
            cookie=cookie,
            management=management,
            server=server,
        )
        self._epmd = _Epmd(first) if first.epmd_port is not None else None
        self.nodes = [first] + [
            LocalNode(
                self.base_dir / f"node{i}",
                config=config,
                advanced_config=advanced_config,
                cookie=cookie,
                management=management,
                server=first.server.name,
                epmd_port=first.epmd_port,
            )
            for i in range(1, size)
        ]

    def __repr__(self) -> str:
        return f"LocalCluster({[node.name for node in self.nodes]!r})"

    @property
    def url(self) -> str:
        """One URL naming every node (delayq's clients try them in turn)."""
        hosts = ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)
        return f"amqp://guest:guest@{hosts}/"

    @property
    def management_urls(self) -> list[str]:
        """Each node's management API URL (``management=True``), first node first."""
        return [node.management_url for node in self.nodes if node.management_url]

    @property
    def version(self) -> str:
        """The version of the server the nodes run, e.g. ``"4.0.5"``."""
        return self.nodes[0].version

    def ctl_command(self, tool: str = "rabbitmqctl") -> list[str]:
        """The argv that runs ``tool`` against the cluster's nodes (add ``-n`` and the
        cookie): what ``--rabbitmqctl`` and :class:`~delayq.ops.watchdog.TransferLeadership`
        take."""
        return self.nodes[0].ctl_command(tool)

    def node_named(self, name: str) -> LocalNode:
        """The node called ``name`` (``delayq-<port>@localhost``)."""
        for node in self.nodes:
            if node.name == name:
                return node
        raise LocalNodeError(f"no node {name!r} in {self!r}")

    def node_on_port(self, port: int) -> LocalNode:
        """The node listening for AMQP on ``port``."""
        for node in self.nodes:
            if node.port == port:
                return node
        raise LocalNodeError(f"no node listens on port {port} in {self!r}")

    # Life cycle ---------------------------------------------------------------

    def start(self, timeout_s: float = 180.0) -> LocalCluster:
        """Start every node, join them into one cluster, and wait until all run."""
        deadline = time.monotonic() + timeout_s
        try:
            if self._epmd is not None:
                self._epmd.start()
            _in_parallel(self.nodes, lambda node: node.start(timeout_s=timeout_s))
            first = self.nodes[0]
            for node in self.nodes[1:]:
                node.ctl("stop_app")
                node.ctl("join_cluster", first.name)
                node.ctl("start_app")
            self.wait_running(self.nodes, timeout_s=max(5.0, deadline - time.monotonic()))
        except BaseException:
            self.cleanup()
            raise
        return self

    def stop_node(self, node: LocalNode) -> None:
        """Stop one node gracefully (:meth:`LocalNode.stop`); it stays a member of the cluster."""
        node.stop()

    def start_node(self, node: LocalNode, timeout_s: float = 120.0) -> None:
        """Start a stopped node again; it rejoins the cluster by itself."""
        node.start(timeout_s=timeout_s)
        self.wait_running([n for n in self.nodes if n.running], timeout_s=timeout_s)

    def running_nodes(self) -> set[str]:
        """Names of the nodes the cluster sees running (asked of any running node)."""
        status = self._ctl_json("cluster_status")
        return set(status.get("running_nodes", []))

    def wait_running(self, nodes: list[LocalNode], timeout_s: float = 60.0) -> None:
        """Wait until the cluster sees every one of ``nodes`` running."""
        wanted = {node.name for node in nodes}
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                seen = self.running_nodes()
            except LocalNodeError:
                seen = set()
            if wanted <= seen:
                return
            if time.monotonic() > deadline:
                raise LocalNodeError(f"nodes {sorted(wanted - seen)} are not running in time")
            time.sleep(0.5)

    def cleanup(self) -> None:
        """Stop every node this cluster started and delete the folder it made."""
        _in_parallel(self.nodes, LocalNode.stop)
        if self._epmd is not None:
            self._epmd.stop()
        if self._own_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()

    # Looking inside -----------------------------------------------------------

    def _ctl_json(self, *args: str) -> Any:
        """``rabbitmqctl <args> --formatter json`` on the first running node that answers."""
        last = LocalNodeError(f"no node of {self!r} is running")
        for node in self.nodes:
            if node.running:
                try:
                    return json.loads(node.ctl(*args, "--formatter", "json") or "null")
                except LocalNodeError as exc:
                    last = exc  # stopping, perhaps: ask the next one
                except subprocess.TimeoutExpired:
                    last = LocalNodeError(f"rabbitmqctl {args[0]} timed out on {node.name}")
        raise last

    def queues(self, vhost: str = "/") -> list[dict[str, Any]]:
        """Every queue of ``vhost``: name, type, leader, members, online members, and
        ``messages`` (ready + unacknowledged, not counting those waiting for
        at-least-once dead-lettering, which ``rabbitmqctl`` 3.10 cannot list)."""
        rows = self._ctl_json(
            "list_queues",
            "-p",
            vhost,
            *("name", "type", "leader", "members", "online"),
            *("messages", "messages_ready", "messages_unacknowledged"),
        )
        return list(rows or [])

    def queue_leaders(self, vhost: str = "/") -> dict[str, str]:
        """Queue name to the name of the node that leads it (quorum queues)."""
        return {row["name"]: row["leader"] for row in self.queues(vhost) if row.get("leader")}

    def pending_dead_letters(self, vhost: str = "/") -> dict[str, int]:
        """Quorum queues holding messages that are neither ready nor unacknowledged: expired
        or rejected ones waiting for at-least-once dead-lettering, by queue name."""
        found = {}
        for row in self.queues(vhost):
            pending = row["messages"] - row["messages_ready"] - row["messages_unacknowledged"]
            if row.get("type") == "quorum" and pending > 0:
                found[row["name"]] = pending
        return found

    def move_leader(self, queue: str, vhost: str = "/", timeout_s: float = 120.0) -> str:
        """Give ``queue`` a new leader: remove its leader's member, then add it back.

        On RabbitMQ 3.10 this is what restarts a quorum queue's at-least-once
        dead-letter worker when it stopped forwarding after a node loss. Returns
        the name of the node that led it.
        """
        leader = self.queue_leaders(vhost)[queue]
        runner = next(n for n in self.nodes if n.running and n.name != leader)
        for step in ("delete_member", "add_member"):
            try:
                runner.ctl(
                    step, "-p", vhost, queue, leader, tool="rabbitmq-queues", timeout_s=timeout_s
                )
            except subprocess.TimeoutExpired:
                raise LocalNodeError(f"{step} {queue} {leader} took over {timeout_s:g} s") from None
        return leader

    def connections(self) -> list[tuple[str, LocalNode]]:
        """``(connection_name, node)`` of every client connection the cluster holds."""
        rows = self._ctl_json("list_connections", "port", "client_properties") or []
        found = []
        for row in rows:
            props = {item[0]: item[2] for item in row.get("client_properties", [])}
            found.append((str(props.get("connection_name", "")), self.node_on_port(row["port"])))
        return found
