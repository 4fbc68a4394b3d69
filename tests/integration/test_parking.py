"""DLQ and unrouted operations through the CLI: list, show, replay (to the queue alone), purge."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pika
import yaml

from delayq import Message, Topology
from delayq.consume.delivery import Reject
from delayq.sync import Consumer, Publisher, apply_topology, parking


def delayq(path: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "delayq", *args, "--file", str(path), "--url", url],
        capture_output=True,
        text=True,
        timeout=60,
    )


def write(topology: Topology, tmp_path: Path) -> Path:
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(topology.model_dump(mode="json")))
    return path


def run_consumer(consumer: Consumer) -> threading.Thread:
    thread = threading.Thread(target=consumer.run, kwargs={"install_signal_handlers": False})
    thread.start()
    assert consumer.started.wait(30)
    return thread


def wait_for(predicate: Any, timeout_s: float = 10) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.05)
    return bool(predicate())


def test_dlq_list_show_replay_and_purge(make_topology, rabbitmq_url, tmp_path):
    topo = make_topology(["1s"])
    queue = f"{topo.namespace}.work"
    path = write(topo, tmp_path)
    apply_topology(topo, rabbitmq_url)

    empty = delayq(path, rabbitmq_url, "dlq", "replay", queue, "--all")
    assert empty.returncode == 0 and "empty: nothing to replay" in empty.stdout

    healed = threading.Event()
    handled: list[Any] = []

    def handler(value: Any) -> None:
        if not healed.is_set():
            raise Reject("the customer record is missing")
        handled.append(value["n"])

    consumer = Consumer(rabbitmq_url, topo, queue, handler)
    thread = run_consumer(consumer)
    with Publisher(rabbitmq_url, topo) as pub:
        pub.publish_many([Message({"n": n}, "job.p", "0s", message_id=f"p-{n}") for n in range(5)])
    assert wait_for(lambda: consumer.stats.dead_lettered == 5)

    listing = delayq(path, rabbitmq_url, "dlq", "list", queue)
    assert listing.returncode == 0, listing.stderr
    assert listing.stdout.count("non-retryable") == 5
    assert "Reject: the customer record is missing" in listing.stdout
    again = delayq(path, rabbitmq_url, "dlq", "list", queue)  # listing removed nothing
    assert again.stdout.count("non-retryable") == 5

    shown = delayq(path, rabbitmq_url, "dlq", "show", queue, "p-3")
    assert shown.returncode == 0 and "message_id    p-3" in shown.stdout
    assert "delayq-dead-letter-reason" in shown.stdout and '"n":3' in shown.stdout
    unknown = delayq(path, rabbitmq_url, "dlq", "show", queue, "nope")
    assert unknown.returncode == 1 and "no message 'nope'" in unknown.stderr

    healed.set()
    one = delayq(path, rabbitmq_url, "dlq", "replay", queue, "--id", "p-2", "--id", "ghost")
    assert one.returncode == 1 and "not found" in one.stderr and "ghost" in one.stderr
    assert "replayed 1 of 5" in one.stdout
    assert wait_for(lambda: handled == [2])
    rest = delayq(path, rabbitmq_url, "dlq", "replay", queue, "--all", "--rate", "50")
    assert rest.returncode == 0 and "replayed 4 of 4" in rest.stdout
    assert wait_for(lambda: sorted(handled) == [0, 1, 2, 3, 4])
    consumer.request_stop()
    thread.join(30)
    assert consumer.stats.handled == 5

    refused = delayq(path, rabbitmq_url, "dlq", "purge", queue)
    assert refused.returncode == 2 and "--yes" in refused.stderr
    purged = delayq(path, rabbitmq_url, "dlq", "purge", queue, "--yes")
    assert purged.returncode == 0 and "purged 0 messages" in purged.stdout


def test_replay_goes_to_the_failing_queue_alone(make_topology, rabbitmq_url, tmp_path, collect):
    ns = make_topology(["1s"]).namespace
    topo = Topology.from_mapping(
        {
            "namespace": ns,
            "ladder": ["1s"],
            "destinations": [
                {"queue": f"{ns}.work", "bindings": ["job.#"]},
                {"queue": f"{ns}.audit", "bindings": ["#"]},
            ],
        }
    )
    path = write(topo, tmp_path)
    apply_topology(topo, rabbitmq_url)
    with Publisher(rabbitmq_url, topo) as pub:  # park one by hand in work's DLQ
        from delayq.message.factory import MessageFactory

        parked = MessageFactory(topo).build({"x": 1}, "job.r", "0s", message_id="r-1")
        object.__setattr__(parked, "exchange", "")
        object.__setattr__(parked, "routing_key", f"{ns}.work.dlq")
        pub.send(parked)
    work, audit = collect(f"{ns}.work"), collect(f"{ns}.audit")
    run = delayq(path, rabbitmq_url, "dlq", "replay", f"{ns}.work", "--all")
    assert run.returncode == 0, run.stderr
    [arrival] = work.wait(1, timeout_s=5)
    assert arrival.message_id == "r-1" and arrival.headers["delayq-attempt"] == 1
    assert "delayq-replayed-at" in arrival.headers
    assert audit.settle(1.0) == []
    from delayq.sync import delete_topology

    delete_topology(topo, rabbitmq_url)


def test_unrouted_list_and_replay_once_a_binding_exists(make_topology, rabbitmq_url, tmp_path):
    topo = make_topology(["1s"], external_bindings=["nobody.*"])  # a key bound elsewhere
    apply_topology(topo, rabbitmq_url)
    with Publisher(rabbitmq_url, topo) as pub:
        pub.publish({"late": True}, "nobody.yet", "0s", message_id="u-1")
    path = write(topo, tmp_path)
    assert wait_for(lambda: "u-1" in delayq(path, rabbitmq_url, "unrouted", "list").stdout)

    # The operator adds the missing binding, then replays.
    fixed = topo.model_dump(mode="json")
    fixed["destinations"][0]["bindings"].append("nobody.yet")
    fixed_topo = Topology.from_mapping(fixed)
    apply_topology(fixed_topo, rabbitmq_url)
    got: list[Any] = []
    consumer = Consumer(rabbitmq_url, fixed_topo, f"{topo.namespace}.work", got.append)
    thread = run_consumer(consumer)
    run = delayq(write(fixed_topo, tmp_path), rabbitmq_url, "unrouted", "replay", "--id", "u-1")
    assert run.returncode == 0, run.stderr
    assert wait_for(lambda: got == [{"late": True}])
    consumer.request_stop()
    thread.join(30)


def test_a_replay_right_after_a_browse_finds_everything_the_browse_saw(make_topology, rabbitmq_url):
    """A browse returns what it took before it ends: a replay (or a count) from another
    connection at once finds all of it (session 11's CI on 4.0.5 replayed 0 of 1)."""
    topo = make_topology(["1s"])
    dlq = f"{topo.namespace}.work.dlq"
    apply_topology(topo, rabbitmq_url)
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    channel = connection.channel()
    channel.confirm_delivery()
    ids = [f"m{i}" for i in range(5)]
    for message_id in ids:
        channel.basic_publish("", dlq, b"{}", pika.BasicProperties(message_id=message_id))
    for _ in range(10):
        assert [p.message_id for p in parking.browse(rabbitmq_url, dlq)] == ids
        assert channel.queue_declare(dlq, passive=True).method.message_count == len(ids)
    connection.close()
    # A browse that stops short puts what it looked at behind the rest (a quorum queue
    # with a delivery limit, as delayq declares parked queues): the next one pages on.
    assert [p.message_id for p in parking.browse(rabbitmq_url, dlq, limit=2)] == ids[:2]
    assert [p.message_id for p in parking.browse(rabbitmq_url, dlq, limit=2)] == ids[2:4]
    report = parking.replay(
        rabbitmq_url, dlq, topo, target=lambda p: ("", f"{topo.namespace}.work")
    )
    assert report.replayed == [*ids[4:], *ids[:4]]
