"""The plugin migration guide's blocks against a real broker, each in a vhost of its own
(its names are fixed): the topology ``delayq migrate plan`` writes from the guide's
definitions applies beside the queue as it is, ``migrate check`` fails until a bridge
runs, and ``x-delay: 1500`` waits in the 30 s tier, as the plan's ladder line says; the
intake topology the guide shows applies, declares what its table lists, and its
publisher block's message is scheduled into the tier its ``x-delay`` asks for.
(tests/unit/test_migrate_plan.py checks the plan's output against the guide's.)"""

from __future__ import annotations

import re
import secrets
import shlex
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pika
import pytest

from delayq import Topology, load_topology
from delayq.cli import main
from delayq.local.node import LocalNode
from delayq.ops.management import ManagementAPI
from delayq.sync.bridge import Bridge
from tests.amqp import depth
from tests.guide_blocks import PLUGIN_GUIDE, block
from tests.integration.intake_support import Running
from tests.integration.ops import add_user, delete_user
from tests.integration.test_readme_examples import VHost, vhost  # noqa: F401 (a fixture)
from tests.waiting import wait_for


@pytest.fixture
def bridged(vhost: VHost) -> Iterator[Callable[[Topology], Bridge]]:  # noqa: F811
    """Bridges started in threads (``start(topology)``), stopped after the test."""
    running: list[tuple[Bridge, threading.Thread]] = []

    def start(topology: Topology) -> Bridge:
        bridge = Bridge(vhost.url, topology)
        thread = threading.Thread(target=lambda: bridge.run(install_signal_handlers=False))
        thread.start()
        running.append((bridge, thread))
        wait_for(bridge.started.is_set, 30, lambda: f"the bridge of {bridge.queue} up")
        return bridge

    yield start
    for bridge, thread in running:
        bridge.request_stop()
        thread.join(30)
        assert not thread.is_alive(), f"the bridge of {bridge.queue} did not stop"


def test_the_planned_topology_applies_beside_the_queue_and_waits_as_its_ladder_says(
    vhost: VHost,  # noqa: F811
    bridged: Callable[[Topology], Bridge],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "definitions.json").write_text(block(PLUGIN_GUIDE, "json", '{\n  "exchanges"'))
    assert main(["migrate", "plan", "definitions.json"]) == 0
    file = "topology/delayq.orders.delayed.yaml"
    connection = pika.BlockingConnection(pika.URLParameters(vhost.url))
    channel = connection.channel()
    channel.queue_declare("orders.reminders", durable=True)  # the plugin user's, classic
    assert main(["topology", "apply", "-f", file, "--url", vhost.url]) == 0
    capsys.readouterr()
    assert main(["migrate", "check", "-f", file, "--url", vhost.url]) == 1
    assert "no bridge consumes" in capsys.readouterr().out
    topology = load_topology(tmp_path / file)
    bridged(topology)
    assert main(["migrate", "check", "-f", file, "--url", vhost.url]) == 0
    channel.confirm_delivery()
    channel.basic_publish("orders.delayed.intake", "order.reminder", b"{}",
                          pika.BasicProperties(headers={"x-delay": 1500}))  # fmt: skip
    tier = "delayq.orders.delayed.tier.30s"  # "x-delay 1500 arrives 28s500ms late"
    wait_for(lambda: depth(vhost.url, tier) == 1, 30, f"the message in {tier}")
    assert depth(vhost.url, "orders.reminders") == 0
    connection.close()


def test_the_intake_topology_applies_declares_its_table_and_takes_its_publisher(
    vhost: VHost,  # noqa: F811
    bridged: Callable[[Topology], Bridge],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "topology" / "orders.yaml"
    path.parent.mkdir()
    path.write_text(block(PLUGIN_GUIDE, "yaml", "# topology/orders.yaml"))
    assert main(["topology", "apply", "-f", str(path), "--url", vhost.url]) == 0
    api = ManagementAPI(vhost.management_url)
    table = re.findall(r"^\| `([^`]+)` \| (fanout exchange|quorum queue) \|",
                       PLUGIN_GUIDE.read_text(), re.M)  # fmt: skip
    assert len(table) == 3, table
    for name, kind in table:
        if kind == "fanout exchange":
            assert (api.exchange(vhost.name, name) or {}).get("type") == "fanout", name
        else:
            assert (api.queue(vhost.name, name) or {}).get("type") == "quorum", name
    bridged(load_topology(path))
    connection = pika.BlockingConnection(pika.URLParameters(vhost.url))
    channel = connection.channel()
    channel.confirm_delivery()
    publisher = block(PLUGIN_GUIDE, "python", "# The publisher: any AMQP client")
    exec(publisher, {"channel": channel, "pika": pika, "body": b"{}"})
    tier = "orders.tier.30m"  # x-delay 15 min: the smallest tier at or above it
    wait_for(lambda: depth(vhost.url, tier) == 1, 30, f"the guide's message in {tier}")
    connection.close()


def test_the_worker_block_bridges_the_intake_and_handles_its_destination(
    vhost: VHost,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The guide's worker block, as written, run from a folder holding its topology: it
    bridges the intake and its handler takes what the publisher block sent."""
    path = tmp_path / "topology" / "orders.yaml"
    path.parent.mkdir()
    path.write_text(block(PLUGIN_GUIDE, "yaml", "# topology/orders.yaml"))
    assert main(["topology", "apply", "-f", str(path), "--url", vhost.url]) == 0
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {}
    exec(block(PLUGIN_GUIDE, "python", "from delayq import Worker, load_topology"), namespace)
    worker = namespace["worker"]
    handled: list[object] = []

    class Seen:
        def settled(self, event: object) -> None:
            handled.append(event)

    stop = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            worker.run(vhost.url, stop=stop, observers=[Seen()])  # type: ignore[attr-defined]
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        connection = pika.BlockingConnection(pika.URLParameters(vhost.url))
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish(
            "orders.delayed.intake", "order.reminder", b'{"order": 42}',
            pika.BasicProperties(content_type="application/json", headers={"x-delay": 0}),
        )  # fmt: skip
        connection.close()
        wait_for(lambda: handled or errors, 60, "the worker's handler ran")
        assert not errors and depth(vhost.url, "orders.intake.orders.delayed.intake") == 0
    finally:
        stop.set()
        thread.join(60)
    assert not thread.is_alive() and not errors


def test_the_grant_block_gives_the_bridge_a_user_of_its_own(
    vhost: VHost,  # noqa: F811
    local_rabbitmq_management_node: LocalNode,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The guide's grant command as written (plus where the test's broker is), on the
    topology ``migrate plan`` writes: the bridge runs as ``relay`` and schedules what the
    producer ``app`` publishes to the intake; ``app`` may not write to ``<ns>.direct``."""
    node = local_rabbitmq_management_node
    monkeypatch.chdir(tmp_path)
    (tmp_path / "definitions.json").write_text(block(PLUGIN_GUIDE, "json", '{\n  "exchanges"'))
    assert main(["migrate", "plan", "definitions.json"]) == 0
    file = "topology/delayq.orders.delayed.yaml"
    connection = pika.BlockingConnection(pika.URLParameters(vhost.url))
    connection.channel().queue_declare("orders.reminders", durable=True)
    connection.close()
    command = shlex.split(block(PLUGIN_GUIDE, "sh", "delayq topology grant").replace("\\\n", ""))
    assert command[:3] == ["delayq", "topology", "grant"]
    passwords = {name: secrets.token_hex(8) for name in ("app", "relay", "ops")}
    for name, password in passwords.items():
        add_user(node, name, password)
    try:
        assert main([*command[1:], "--url", vhost.url, "--via", "management",
                     "--management-url", str(node.management_url)]) == 0  # fmt: skip
        capsys.readouterr()
        url = vhost.url.replace("guest:guest", "{}:{}")
        ops = url.format("ops", passwords["ops"])
        assert main(["topology", "apply", "-f", file, "--url", ops]) == 0
        topology = load_topology(tmp_path / file)
        running = Running(Bridge(url.format("relay", passwords["relay"]), topology))
        try:
            app = pika.BlockingConnection(pika.URLParameters(url.format("app", passwords["app"])))
            channel = app.channel()
            channel.confirm_delivery()
            channel.basic_publish("orders.delayed.intake", "order.reminder", b"{}",
                                  pika.BasicProperties(headers={"x-delay": 1500}))  # fmt: skip
            tier = "delayq.orders.delayed.tier.30s"
            wait_for(lambda: depth(vhost.url, tier) == 1, 30, f"the message in {tier}")
            with pytest.raises(pika.exceptions.ChannelClosedByBroker, match="ACCESS_REFUSED"):
                channel.basic_publish("delayq.orders.delayed.direct", "orders.reminders", b"x")
            app.close()
        finally:
            running.stop()
    finally:
        for name in passwords:
            delete_user(node, name)
