"""``delayq migrate plan | check``: a broker's definitions with two delayed-message
exchanges (one topic, one direct, several bindings) become topologies that ``delayq
topology apply`` accepts beside the queues as they are, and ``migrate check`` fails
until a bridge consumes each intake, then passes. Misuse is refused naming the entity.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pika
import pytest

from delayq import Topology, load_topology
from delayq.cli import main
from delayq.sync import delete_topology
from delayq.sync.bridge import Bridge
from tests.waiting import wait_for


def _definitions(tag: str) -> dict[str, Any]:
    """What ``rabbitmqctl export_definitions`` writes for a plugin user's broker."""
    def exchange(name: str, kind: str) -> dict[str, Any]:
        return {"name": name, "vhost": "/", "type": "x-delayed-message", "durable": True,
                "auto_delete": False, "internal": False, "arguments": {"x-delayed-type": kind}}

    def binding(source: str, queue: str, key: str) -> dict[str, Any]:
        return {"source": source, "vhost": "/", "destination": queue,
                "destination_type": "queue", "routing_key": key, "arguments": {}}

    return {
        "rabbit_version": "3.10.8",
        "queues": [{"name": f"{tag}-{q}", "vhost": "/", "durable": True, "auto_delete": False,
                    "arguments": {}} for q in ("emails", "sms", "audit", "invoices")],
        "exchanges": [
            exchange(f"{tag}-notify", "topic"),
            exchange(f"{tag}-billing", "direct"),
            {"name": f"{tag}-plain", "vhost": "/", "type": "topic", "durable": True,
             "auto_delete": False, "internal": False, "arguments": {}},
        ],
        "bindings": [
            binding(f"{tag}-notify", f"{tag}-emails", "notify.email.*"),
            binding(f"{tag}-notify", f"{tag}-sms", "notify.sms"),
            binding(f"{tag}-notify", f"{tag}-audit", "notify.#"),
            binding(f"{tag}-billing", f"{tag}-invoices", "invoice.due"),
            binding(f"{tag}-billing", f"{tag}-audit", "invoice.paid"),
        ],
    }  # fmt: skip


def _bridged(url: str, topology: Topology) -> tuple[Bridge, threading.Thread]:
    """A bridge of the topology's intake, running in a thread, consuming."""
    bridge = Bridge(url, topology)
    thread = threading.Thread(target=lambda: bridge.run(install_signal_handlers=False))
    thread.start()
    wait_for(bridge.started.is_set, 30, lambda: f"the bridge of {bridge.queue} up")
    return bridge, thread


def _unbridged(running: list[tuple[Bridge, threading.Thread]]) -> None:
    for bridge, thread in running:
        bridge.request_stop()
        thread.join(30)
        assert not thread.is_alive(), f"the bridge of {bridge.queue} did not stop"


def _quiet(channel: Any, topologies: list[Topology]) -> Callable[[], bool]:
    """True once no tier and no intake queue of ``topologies`` holds a message: nothing
    more is on its way to the destinations."""
    queues = [t.tier_name(tier) for t in topologies for tier in t.ladder.tiers]
    queues += [i.queue_name(t.namespace) for t in topologies for i in t.intakes]
    return lambda: all(
        channel.queue_declare(q, passive=True).method.message_count == 0 for q in queues
    )


def test_plan_writes_topologies_apply_accepts_and_check_passes_once_bridged(
    rabbitmq_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], collect: Any
) -> None:
    tag = f"m{uuid.uuid4().hex[:8]}"
    definitions = tmp_path / "definitions.json"
    definitions.write_text(json.dumps(_definitions(tag)))
    delays = tmp_path / "delays.txt"
    delays.write_text("1000\n2000\n")  # each a tier of the fitted ladder
    out = tmp_path / "topology"
    assert main(["migrate", "plan", str(definitions), "--out", str(out),
                 "--delays", str(delays)]) == 0  # fmt: skip
    said = capsys.readouterr().out
    files = {f"{tag}-notify": out / f"delayq.{tag}-notify.yaml",
             f"{tag}-billing": out / f"delayq.{tag}-billing.yaml"}  # fmt: skip
    for exchange, path in files.items():
        assert f"exchange {exchange!r} -> {path}" in said
    assert "point the publishers at exchange" in said and "holds no delayed message" in said
    assert "bind exchange" not in said  # only queues are bound to these
    notify, billing = (load_topology(files[e]) for e in (f"{tag}-notify", f"{tag}-billing"))
    assert {d.queue: d.bindings for d in notify.destinations} == {
        f"{tag}-audit": ("notify.#",), f"{tag}-emails": ("notify.email.*",),
        f"{tag}-sms": ("notify.sms",),
    }  # fmt: skip
    assert {d.queue: d.bindings for d in billing.destinations} == {
        f"{tag}-audit": ("invoice.paid",), f"{tag}-invoices": ("invoice.due",)}  # fmt: skip
    assert all(d.existing for d in notify.destinations + billing.destinations)
    assert (notify.intakes[0].exchange, notify.intakes[0].type) == (f"{tag}-notify.intake", "topic")
    assert (billing.intakes[0].exchange, billing.intakes[0].type) == (
        f"{tag}-billing.intake", "direct")  # fmt: skip
    tiers = [t.ttl_ms for t in notify.ladder.tiers]
    assert tiers[:2] == [1_000, 2_000] and tiers[-1] == 86_400_000 and len(tiers) == 9

    # The queues exist as the plugin's users made them (classic here): only bound.
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    channel = connection.channel()
    queues = [f"{tag}-{q}" for q in ("emails", "sms", "audit", "invoices")]
    for queue in queues:
        channel.queue_declare(queue, durable=True)
    running: list[tuple[Bridge, threading.Thread]] = []
    try:
        for path in files.values():
            assert main(["topology", "apply", "-f", str(path), "--url", rabbitmq_url]) == 0
            capsys.readouterr()
            code = main(["migrate", "check", "-f", str(path), "--url", rabbitmq_url])
            said = capsys.readouterr().out
            assert code == 1 and "no bridge consumes" in said, said
        running.append(_bridged(rabbitmq_url, notify))
        # One intake bridged is not all: the other's check still fails, naming it.
        code = main(["migrate", "check", "-f", str(files[f"{tag}-billing"]), "--url",
                     rabbitmq_url])  # fmt: skip
        said = capsys.readouterr().out
        assert code == 1 and f"{billing.namespace}.intake.{tag}-billing.intake" in said, said
        running.append(_bridged(rabbitmq_url, billing))
        for exchange, path in files.items():
            code = main(["migrate", "check", "-f", str(path), "--url", rabbitmq_url])
            said = capsys.readouterr().out
            assert code == 0, said
            assert f"applied, and every intake bridged ({exchange}.intake)" in said

        # Plugin-style messages through both intakes (raw pika, an x-delay header, the
        # routing keys the plugin exchanges had), confirmed: each reaches the queues the
        # plugin's bindings reached, once, and never before its x-delay.
        arrived = collect(*queues)
        publisher = connection.channel()
        publisher.confirm_delivery()
        sent = {  # message id: (intake, routing key, x-delay in ms)
            "n-email": (f"{tag}-notify.intake", "notify.email.welcome", 1000),
            "n-sms": (f"{tag}-notify.intake", "notify.sms", 2000),
            "b-due": (f"{tag}-billing.intake", "invoice.due", 1000),
            "b-paid": (f"{tag}-billing.intake", "invoice.paid", 2000),
        }
        expected = Counter({
            (f"{tag}-emails", "n-email"): 1, (f"{tag}-audit", "n-email"): 1,
            (f"{tag}-sms", "n-sms"): 1, (f"{tag}-audit", "n-sms"): 1,
            (f"{tag}-invoices", "b-due"): 1, (f"{tag}-audit", "b-paid"): 1,
        })  # fmt: skip
        sent_at_ms: dict[str, float] = {}
        for message_id, (exchange, key, delay) in sent.items():
            sent_at_ms[message_id] = time.time() * 1000
            publisher.basic_publish(exchange, key, b"{}", pika.BasicProperties(
                message_id=message_id, headers={"x-delay": delay}), mandatory=True)  # fmt: skip
        arrived.wait(sum(expected.values()), 60)
        wait_for(_quiet(channel, [notify, billing]), 30, "the tiers and intakes drained")
        got = arrived.wait(sum(expected.values()), 0)
        assert Counter((a.queue, a.message_id) for a in got) == expected
        for arrival in got:
            delay = sent[arrival.message_id][2]
            assert arrival.at_ms >= sent_at_ms[arrival.message_id] + delay, (
                f"{arrival.message_id} reached {arrival.queue} early")  # fmt: skip
    finally:
        _unbridged(running)
        for path in files.values():
            delete_topology(load_topology(path), rabbitmq_url)
        for queue in queues:
            channel.queue_delete(queue)
        connection.close()


def test_an_exchange_bound_to_the_plugin_exchange_is_bound_by_hand_and_reached(
    rabbitmq_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], collect: Any
) -> None:
    """An exchange bound to the plugin exchange (here a fanout of the user's, a queue
    behind it) becomes an ``external_bindings`` key and a step to bind it by hand: once
    applied and bound as the step says, a message through the intake reaches the queue
    behind that exchange."""
    tag = f"e{uuid.uuid4().hex[:8]}"
    plugin, fanout, behind, created = (f"{tag}-events", f"{tag}-fanout", f"{tag}-behind",
                                       f"{tag}-created")  # fmt: skip
    definitions = tmp_path / "definitions.json"
    definitions.write_text(json.dumps({
        "exchanges": [
            {"name": plugin, "vhost": "/", "type": "x-delayed-message", "durable": True,
             "auto_delete": False, "internal": False, "arguments": {"x-delayed-type": "topic"}},
            {"name": fanout, "vhost": "/", "type": "fanout", "durable": True,
             "auto_delete": False, "internal": False, "arguments": {}},
        ],
        "bindings": [
            {"source": plugin, "vhost": "/", "destination": fanout,
             "destination_type": "exchange", "routing_key": "event.#", "arguments": {}},
            {"source": plugin, "vhost": "/", "destination": created,
             "destination_type": "queue", "routing_key": "event.created", "arguments": {}},
            {"source": fanout, "vhost": "/", "destination": behind,
             "destination_type": "queue", "routing_key": "", "arguments": {}},
        ],
    }))  # fmt: skip
    delays = tmp_path / "delays.txt"
    delays.write_text("1000\n")
    out = tmp_path / "topology"
    assert main(["migrate", "plan", str(definitions), "--out", str(out),
                 "--delays", str(delays)]) == 0  # fmt: skip
    said = capsys.readouterr().out
    path = out / f"delayq.{plugin}.yaml"
    topology = load_topology(path)
    assert topology.external_bindings == ("event.#",)
    assert {d.queue: d.bindings for d in topology.destinations} == {created: ("event.created",)}
    assert "external_bindings:\n- event.#\n" in path.read_text()
    ready = f"delayq.{plugin}.ready"
    assert ready == topology.ready_exchange
    steps = [line.strip() for line in said.splitlines() if re.match(r"  \d+\. ", line)]
    assert steps[0].startswith(f"1. delayq topology apply -f {path}")
    assert steps[1] == (
        f"2. bind exchange {fanout!r} to {ready} with routing key 'event.#' (management UI "
        "or API: delayq binds no exchange of yours)"
    )
    assert steps[2].startswith(f"3. delayq bridge -f {path}")

    # The user's entities, as they were: the fanout exchange, a queue behind it, a queue.
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    channel = connection.channel()
    channel.exchange_declare(fanout, "fanout", durable=True)
    for queue in (behind, created):
        channel.queue_declare(queue, durable=True)
    channel.queue_bind(behind, fanout)
    running: list[tuple[Bridge, threading.Thread]] = []
    try:
        assert main(["topology", "apply", "-f", str(path), "--url", rabbitmq_url]) == 0
        channel.exchange_bind(destination=fanout, source=ready, routing_key="event.#")  # step 2
        running.append(_bridged(rabbitmq_url, topology))
        capsys.readouterr()
        code = main(["migrate", "check", "-f", str(path), "--url", rabbitmq_url])
        assert code == 0, capsys.readouterr().out
        arrived = collect(behind, created)
        publisher = connection.channel()
        publisher.confirm_delivery()
        sent_at_ms = {}
        for message_id, key in (("e-signup", "event.user.signup"), ("e-created", "event.created")):
            sent_at_ms[message_id] = time.time() * 1000
            publisher.basic_publish(f"{plugin}.intake", key, b"{}", pika.BasicProperties(
                message_id=message_id, headers={"x-delay": 1000}), mandatory=True)  # fmt: skip
        expected = Counter({(behind, "e-signup"): 1, (behind, "e-created"): 1,
                            (created, "e-created"): 1})  # fmt: skip
        arrived.wait(sum(expected.values()), 60)
        wait_for(_quiet(channel, [topology]), 30, "the tier and the intake drained")
        got = arrived.wait(sum(expected.values()), 0)
        assert Counter((a.queue, a.message_id) for a in got) == expected
        for arrival in got:
            assert arrival.at_ms >= sent_at_ms[arrival.message_id] + 1000, (
                f"{arrival.message_id} reached {arrival.queue} early")  # fmt: skip
    finally:
        _unbridged(running)
        delete_topology(topology, rabbitmq_url)
        channel.exchange_delete(fanout)
        for queue in (behind, created):
            channel.queue_delete(queue)
        connection.close()


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda d: (d["exchanges"][0]["arguments"].update({"x-delayed-type": "headers"}),
                    d["bindings"][0].update({"arguments": {"x-match": "any"}})),
         "an x-match 'any' table with no header matches no message"),
        (lambda d: d["exchanges"][0]["arguments"].clear(), "has no x-delayed-type"),
        (lambda d: d["bindings"][3].update({"routing_key": "invoice.*"}),
         "(direct) has key 'invoice.*'"),
        (lambda d: d["bindings"][0].update({"arguments": {"x-match": "all"}}), "has arguments"),
        (lambda d: d.update({"exchanges": d["exchanges"][2:]}), "no x-delayed-message exchange"),
        (lambda d: d.update({"bindings": 5}), "'bindings' must be a list"),
        (lambda d: d["bindings"][0].pop("destination"), "names no destination"),
    ],
)  # fmt: skip
def test_plan_refuses_what_cannot_be_reproduced_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: Any, said: str
) -> None:
    data = _definitions("x")
    change(data)
    definitions = tmp_path / "definitions.json"
    definitions.write_text(json.dumps(data))
    assert main(["migrate", "plan", str(definitions), "--out", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err


def test_plan_refuses_a_file_that_is_not_definitions_and_fits_a_ladder_to_a_sample(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    assert main(["migrate", "plan", str(bad)]) == 2
    assert "are not RabbitMQ definitions" in capsys.readouterr().err
    assert main(["migrate", "plan", str(tmp_path / "none.json")]) == 2
    assert "cannot read definitions" in capsys.readouterr().err
    definitions = tmp_path / "definitions.json"
    definitions.write_text(json.dumps(_definitions("y")))
    delays = tmp_path / "delays.txt"
    delays.write_text("# observed x-delay values\n" + "\n".join(["5000", "60000", "900000"] * 10))
    out = tmp_path / "t"
    assert main(["migrate", "plan", str(definitions), "--out", str(out), "--delays",
                 str(delays), "--json"]) == 0  # fmt: skip
    planned = json.loads(capsys.readouterr().out)["exchanges"]
    topology = load_topology(Path(planned[0]["topology_file"]))
    assert [t.ttl_ms for t in topology.ladder.tiers][-1] >= 900_000
    assert len(topology.ladder.tiers) <= 9
    delays.write_text("soon\n")
    assert main(["migrate", "plan", str(definitions), "--delays", str(delays)]) == 2
    assert "'soon' is not a delay in milliseconds" in capsys.readouterr().err


def test_the_cut_over_loses_nothing_with_traffic_before_during_and_after(
    rabbitmq_url: str, tmp_path: Path, collect: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """The guide's steps in order, a publisher sending plugin-style messages throughout
    and moved from the old exchange to the intake half-way. The delayed-message plugin
    itself cannot be installed on these machines (no package registry they reach has
    it): the old exchange is a direct exchange standing in for it, bound as the plugin's
    was, which delivers at once. Every confirmed message reaches the queue exactly once,
    the queue is never redeclared, and what went through the intake is never early."""
    tag = f"c{uuid.uuid4().hex[:8]}"
    old, queue = f"{tag}-billing", f"{tag}-invoices"
    definitions = tmp_path / "definitions.json"
    definitions.write_text(json.dumps({
        "exchanges": [{"name": old, "vhost": "/", "type": "x-delayed-message",
                       "durable": True, "auto_delete": False, "internal": False,
                       "arguments": {"x-delayed-type": "direct"}}],
        "bindings": [{"source": old, "vhost": "/", "destination": queue,
                      "destination_type": "queue", "routing_key": "invoice.due",
                      "arguments": {}}],
    }))  # fmt: skip
    delays = tmp_path / "delays.txt"
    delays.write_text("1000\n2000\n")
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    admin = connection.channel()
    admin.exchange_declare(old, "direct", durable=True)  # the plugin's stand-in
    admin.queue_declare(queue, durable=True, arguments={"x-max-priority": 5})  # theirs
    admin.queue_bind(queue, old, "invoice.due")
    arrived = collect(queue)
    target = {"exchange": old}
    sent: dict[str, tuple[str, float, int]] = {}
    stop = threading.Event()

    def publish() -> None:
        out = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
        channel = out.channel()
        channel.confirm_delivery()
        n = 0
        while not stop.is_set():
            exchange, delay = target["exchange"], 1000 * (1 + n % 2)
            mid = f"i-{n}"
            # A delay counts from the send, not from the confirm: a bridge that streams
            # has the message in its tier before the publisher hears its confirm.
            at_ms = time.time() * 1000
            channel.basic_publish(exchange, "invoice.due", b"{}", pika.BasicProperties(
                message_id=mid, headers={"x-delay": delay}))  # fmt: skip
            sent[mid] = (exchange, at_ms, delay)  # confirmed
            n += 1
            time.sleep(0.005)
        out.close()

    publisher = threading.Thread(target=publish, daemon=True)
    publisher.start()
    path = tmp_path / "topology" / f"delayq.{old}.yaml"
    bridge = None
    try:
        wait_for(lambda: len(sent) > 100, 30, lambda: "traffic before")
        assert main(["migrate", "plan", str(definitions), "--out", str(path.parent),
                     "--delays", str(delays)]) == 0  # fmt: skip
        assert main(["topology", "apply", "-f", str(path), "--url", rabbitmq_url]) == 0
        topology = load_topology(path)
        bridge = Bridge(rabbitmq_url, topology)
        thread = threading.Thread(target=lambda: bridge.run(install_signal_handlers=False))
        thread.start()
        wait_for(bridge.started.is_set, 30, lambda: "bridge up")
        assert main(["migrate", "check", "-f", str(path), "--url", rabbitmq_url]) == 0
        before = len(sent)
        target["exchange"] = f"{old}.intake"  # the publishers' configuration change
        wait_for(lambda: len(sent) > before + 200, 30, lambda: "traffic during")
        admin.exchange_delete(old)  # drained: the stand-in holds nothing
        after = len(sent)
        wait_for(lambda: len(sent) > after + 100, 30, lambda: "traffic after")
    finally:
        stop.set()
        publisher.join(30)
    try:
        got = arrived.wait(len(sent), 60)
        ids = [a.message_id for a in got]
        assert sorted(ids) == sorted(sent) and len(set(ids)) == len(ids)  # once each
        through_intake = [a for a in got if sent[a.message_id][0] == f"{old}.intake"]
        assert len(through_intake) > 300
        for arrival in through_intake:
            _exchange, at_ms, delay = sent[arrival.message_id]
            assert arrival.at_ms >= at_ms + delay, f"{arrival.message_id} early"
        declared = admin.queue_declare(queue, durable=True, arguments={"x-max-priority": 5})
        assert declared.method.message_count == 0  # the queue is theirs, as it was
    finally:
        if bridge is not None:
            bridge.request_stop()
            thread.join(30)
        delete_topology(load_topology(path), rabbitmq_url)
        admin.queue_delete(queue)
        connection.close()
    capsys.readouterr()


def test_plan_reads_the_definitions_from_the_management_api(
    local_rabbitmq_management_node: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """This node has no plugin exchange (the plugin cannot be installed here), so the
    plan says none is there: the definitions were read from the API, not a file."""
    node = local_rabbitmq_management_node
    code = main(["migrate", "plan", "--management-url", node.management_url,
                 "--out", str(tmp_path)])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "no x-delayed-message exchange in vhost '/'" in err, err
    assert main(["migrate", "plan", "--management-url", node.management_url,
                 str(tmp_path / "d.json")]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert "definitions" in err and "--management-url" in err, err


def test_a_binding_in_the_file_never_applied_fails_the_check_where_bindings_are_seen(
    local_rabbitmq_management_node: Any, tmp_path: Path, capsys: Any
) -> None:
    """A binding added to the file but never applied (the replay flow's forgotten step):
    the check passed and the key's messages went to ``<ns>.unrouted`` (outside tester).
    With the management API the check names it and fails; over AMQP alone it says that
    bindings were not compared."""
    import yaml

    from delayq.local.node import LocalNode
    from delayq.sync import apply_topology

    node: LocalNode = local_rabbitmq_management_node
    ns = f"m{uuid.uuid4().hex[:10]}"
    applied = Topology(
        namespace=ns, ladder=["1s"],
        destinations=[{"queue": f"{ns}.work", "bindings": ["order.a"]}],
        intakes=[{"exchange": f"plugin-{ns}", "type": "direct"}],
    )  # fmt: skip
    apply_topology(applied, node.url)
    edited = Topology.model_validate(
        {**applied.model_dump(),
         "destinations": [{"queue": f"{ns}.work", "bindings": ["order.a", "order.new"]}]}
    )  # fmt: skip
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(edited.model_dump(mode="json")))
    running = [_bridged(node.url, applied)]
    try:
        assert node.management_url is not None
        check = ["migrate", "check", "-f", str(path), "--url", node.url]
        code = main([*check, "--management-url", node.management_url, "--json"])
        said = json.loads(capsys.readouterr().out)
        assert code == 1 and not said["passed"], said
        assert any("order.new" in problem for problem in said["problems"]), said
        assert main([*check, "--no-management"]) == 0
        out = capsys.readouterr().out
        assert "its bindings not compared: AMQP cannot list them" in out, out
        assert main([*check, "--no-management", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["not_checked"] == ["bindings"]
    finally:
        _unbridged(running)
        delete_topology(edited, node.url)
