"""A ``headers`` intake on a real broker: plugin-style publishers (raw pika: an exchange,
an ``x-delay`` header, their own headers, any routing key or none) keep publishing, and
each message reaches the queues whose x-match tables its headers match, once, never
before its delay; one that matches no table is parked in ``<ns>.unrouted``. Then
``delayq topology verify`` (through the management API) passes after apply and fails
naming a missing table; and ``delayq migrate plan`` turns a headers x-delayed-message
exchange into a topology ``topology apply`` accepts and ``migrate check`` verifies.

One node with the management plugin serves the file (``DELAYQ_RABBITMQ_SERVER`` picks
3.10.8 or 4.0.5)."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pika
import pytest
import yaml

from delayq import Topology, load_topology
from delayq.cli import main
from delayq.local.node import LocalNode
from delayq.sync import apply_topology, delete_topology
from delayq.sync.bridge import Bridge
from tests.integration.conftest import Collector
from tests.integration.intake_support import Running, publish_plugin_style
from tests.integration.ops import delayq, rows
from tests.waiting import wait_for

EU = {"x-match": "all", "tenant": "acme", "region": "eu"}
URGENT = [{"x-match": "any", "vip": True, "priority": 9}, {"kind": "page"}]
TAGGED = [{"x-match": "any-with-x", "x-tag": "t"}]
"""``-with-x``: RabbitMQ 3.10 and later compare ``x-`` headers too."""

CASES: list[tuple[str, dict[str, Any], int, str, set[str]]] = [
    ("eu", {"tenant": "acme", "region": "eu", "lang": "fr"}, 1000, "", {"eu"}),
    ("vip", {"vip": True}, 1500, "any.key.at.all", {"urgent"}),
    ("prio", {"priority": 9}, 0, "", {"urgent"}),
    # Both of urgent's tables match, and eu's: one copy in each queue.
    ("both", {"tenant": "acme", "region": "eu", "vip": True, "kind": "page"}, 2000, "",
     {"eu", "urgent"}),
    ("none", {"tenant": "acme"}, 1000, "", {"unrouted"}),
    # Typed: a text "9" is not the integer 9, nor 1 the boolean true.
    ("typed", {"priority": "9", "vip": 1}, 500, "", {"unrouted"}),
    ("xtag", {"x-tag": "t", "tenant": "acme", "region": "eu"}, 500, "", {"tagged", "eu"}),
]  # fmt: skip

ROUNDS = 20


def _topology(strategy: str) -> Topology:
    ns = f"h{uuid.uuid4().hex[:10]}"
    data: dict[str, Any] = {
        "namespace": ns,
        "ladder": ["1s", "2s"],
        "destinations": [
            {"queue": f"{ns}-eu", "headers": [EU]},
            {"queue": f"{ns}-urgent", "headers": URGENT},
            {"queue": f"{ns}-tagged", "headers": TAGGED},
        ],
        "intakes": [{"exchange": f"plugin-{ns}", "type": "headers", "strategy": strategy}],
    }
    if strategy == "exact":
        data["exact"] = {"unit": "250ms", "levels": 4}
    return Topology.model_validate(data)


def _publish(url: str, exchange: str, messages: list[dict[str, Any]]) -> None:
    """A plugin publisher (:func:`publish_plugin_style`): x-delay among the message's
    headers, an empty JSON body; each message's ``sent_ms`` is when it was sent."""
    sent = [
        {
            "id": m["id"],
            "routing_key": m["key"],
            "body": b"{}",
            "headers": {**m["headers"], "x-delay": m["delay"]},
        }
        for m in messages
    ]
    publish_plugin_style(url, exchange, sent)
    for m, s in zip(messages, sent, strict=True):
        m["sent_ms"] = s["sent_ms"]


def _barrier(url: str, topology: Topology, collector: Collector) -> None:
    """Every copy the broker routed so far has arrived: a message through the same
    exchanges into each queue, after the others, arrives after any earlier copy (a
    queue is first in, first out)."""
    _publish(url, topology.ready_exchange, [
        {"id": "barrier-tables", "key": "", "delay": 0,
         "headers": {"tenant": "acme", "region": "eu", "vip": True}},
        {"id": "barrier-unrouted", "key": "", "delay": 0, "headers": {"nothing": "matches"}},
    ])  # fmt: skip
    queues = {topology.destinations[0].queue, topology.destinations[1].queue, topology.unrouted}
    _publish(url, topology.ready_exchange, [
        {"id": "barrier-x", "key": "", "delay": 0, "headers": {"x-tag": "t"}}])  # fmt: skip
    queues.add(topology.destinations[2].queue)

    def arrived() -> set[str]:
        return {a.queue for a in collector.arrivals if a.message_id.startswith("barrier-")}

    wait_for(lambda: arrived() == queues, 30, lambda: f"the barrier in {queues - arrived()}")


@pytest.mark.parametrize("strategy", ["tiered", "exact"])
def test_plugin_style_messages_reach_the_queues_their_headers_match_once_never_early(
    local_rabbitmq_management_node: LocalNode, strategy: str
) -> None:
    url = local_rabbitmq_management_node.url
    topology = _topology(strategy)
    names = {d.queue.split("-")[-1]: d.queue for d in topology.destinations}
    names["unrouted"] = topology.unrouted
    apply_topology(topology, url)
    collector = Collector(url, list(names.values())).start()
    running = Running(Bridge(url, topology, prefetch=100))
    try:
        messages = [
            {"id": f"{name}-{n}", "headers": headers, "delay": delay, "key": key, "to": to}
            for n in range(ROUNDS)
            for name, headers, delay, key, to in CASES
        ]
        _publish(url, topology.intakes[0].exchange, messages)
        expected = sum(len(m["to"]) for m in messages)
        wait_for(lambda: len(collector.arrivals) >= expected, 60,
                 lambda: f"{expected} copies, {len(collector.arrivals)} so far")  # fmt: skip
        _barrier(url, topology, collector)
        arrivals = [a for a in collector.arrivals if not a.message_id.startswith("barrier-")]
        got = Counter((a.message_id, a.queue) for a in arrivals)
        wanted = Counter((m["id"], names[q]) for m in messages for q in m["to"])
        assert got == wanted  # each where its headers lead, once
        sent = {m["id"]: m for m in messages}
        for arrival in arrivals:
            m = sent[arrival.message_id]
            assert arrival.at_ms >= m["sent_ms"] + m["delay"], arrival.message_id  # never early
            if strategy == "tiered":  # the cascade delivers under its own key, the header kept
                assert arrival.routing_key == m["key"]
            assert arrival.headers["delayq-routing-key"] == m["key"]  # delayq's headers: no harm
            for key, value in m["headers"].items():
                assert arrival.headers[key] == value
        tiers = {a.headers["delayq-tier"] for a in arrivals}
        waits = {"immediate", "1s", "2s"} if strategy == "tiered" else {"immediate", "exact"}
        assert tiers == waits
    finally:
        running.stop()
        collector.stop()
        delete_topology(topology, url)


def test_verify_passes_after_apply_and_names_a_missing_header_table(
    local_rabbitmq_management_node: LocalNode, tmp_path: Path
) -> None:
    node = local_rabbitmq_management_node
    assert node.management_url is not None
    topology = _topology("tiered")
    path = tmp_path / "headers.yaml"
    path.write_text(yaml.safe_dump(topology.model_dump(mode="json", exclude_defaults=True)))
    apply_topology(load_topology(path), node.url)
    verify = ("topology", "verify", "--file", str(path), "--url", node.url,
              "--management-url", node.management_url)  # fmt: skip
    connection = pika.BlockingConnection(pika.URLParameters(node.url))
    try:
        run = delayq(*verify)
        assert run.returncode == 0, run.stdout + run.stderr
        table = rows(run.stdout)
        assert all(status == "OK" for status, _ in table.values()), run.stdout
        assert f"arrived through {topology.headers_exchange}" in table["dead-lettering probe"][1]
        channel = connection.channel()
        # The probe went the headers way and matched its own table: nothing parked.
        assert channel.queue_declare(topology.unrouted, passive=True).method.message_count == 0
        urgent = topology.destinations[1].queue
        channel.queue_unbind(urgent, topology.headers_exchange, "", arguments={"kind": "page"})
        run = delayq(*verify, "--no-probe")
        assert run.returncode == 1, run.stdout + run.stderr
        status, detail = rows(run.stdout)["bindings"]
        assert status == "FAIL"
        assert f"{topology.headers_exchange} -> {urgent} [{{kind='page', x-match='all'}}]" in detail
    finally:
        connection.close()
        delete_topology(topology, node.url)


def _definitions(tag: str) -> dict[str, Any]:
    """``rabbitmqctl export_definitions`` of a broker with a headers delayed exchange."""

    def binding(queue: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return {"source": f"{tag}-events", "vhost": "/", "destination": f"{tag}-{queue}",
                "destination_type": "queue", "routing_key": "", "arguments": arguments}

    return {
        "rabbit_version": "3.10.8",
        "queues": [{"name": f"{tag}-{q}", "vhost": "/", "durable": True, "auto_delete": False,
                    "arguments": {}} for q in ("eu", "urgent")],
        "exchanges": [{"name": f"{tag}-events", "vhost": "/", "type": "x-delayed-message",
                       "durable": True, "auto_delete": False, "internal": False,
                       "arguments": {"x-delayed-type": "headers"}}],
        "bindings": [binding("eu", EU), binding("urgent", URGENT[0]),
                     binding("urgent", URGENT[1])],
    }  # fmt: skip


def test_migrate_plans_a_headers_exchange_apply_accepts_and_check_verifies(
    local_rabbitmq_management_node: LocalNode,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = local_rabbitmq_management_node.url
    tag = f"g{uuid.uuid4().hex[:8]}"
    definitions = tmp_path / "definitions.json"
    definitions.write_text(json.dumps(_definitions(tag)))
    out = tmp_path / "topology"
    assert main(["migrate", "plan", str(definitions), "--out", str(out)]) == 0
    capsys.readouterr()
    path = out / f"delayq.{tag}-events.yaml"
    topology = load_topology(path)
    assert topology.intakes[0].type == "headers"
    assert {d.queue: d.headers for d in topology.destinations} == {
        f"{tag}-eu": (EU,), f"{tag}-urgent": tuple(URGENT)
    }
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    for queue in ("eu", "urgent"):  # the plugin users' own queues, classic: only bound
        channel.queue_declare(f"{tag}-{queue}", durable=True)
    try:
        assert main(["topology", "apply", "-f", str(path), "--url", url]) == 0
        capsys.readouterr()
        assert main(["migrate", "check", "-f", str(path), "--url", url]) == 1
        assert "no bridge consumes" in capsys.readouterr().out
        running = Running(Bridge(url, topology))
        try:
            assert main(["migrate", "check", "-f", str(path), "--url", url]) == 0
            assert "applied, and every intake bridged" in capsys.readouterr().out
            intake = topology.intakes[0].exchange
            _publish(url, intake, [
                {"id": "p-1", "key": "", "delay": 0, "headers": {"tenant": "acme", "region": "eu"}},
                {"id": "p-2", "key": "", "delay": 0, "headers": {"tenant": "nobody"}},
            ])  # fmt: skip

            def count(queue: str) -> int:
                return int(channel.queue_declare(queue, passive=True).method.message_count)

            def where() -> str:
                return f"eu {count(f'{tag}-eu')}, unrouted {count(topology.unrouted)}"

            wait_for(lambda: where() == "eu 1, unrouted 1", 30, where)
            assert count(f"{tag}-urgent") == 0
        finally:
            running.stop()
    finally:
        delete_topology(topology, url)
        for queue in ("eu", "urgent"):
            channel.queue_delete(f"{tag}-{queue}")
        connection.close()
