"""`delayq dlq|unrouted list|show` against a real broker (issue 12, items 3, 8, 11, 13).

Broker dead-letter reasons from x-death, decoded values, the original routing key,
masked sensitive headers, --json, and a closed stdout pipe.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pika
import pytest
import yaml

from delayq import Topology
from delayq.cli import main
from delayq.message.factory import MessageFactory
from delayq.sync import Publisher, apply_topology
from tests.amqp import depth
from tests.waiting import wait_for


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def delayq(capsys, monkeypatch):
    """Run ``delayq ARGS --file PATH --url URL`` in this process (faster than a subprocess);
    the options after the command, where the code before issue 12 also read them."""

    def run(path: Path, url: str, *args: str, env: dict[str, str] | None = None) -> Run:
        with monkeypatch.context() as patch:
            for name, value in (env or {}).items():
                patch.setenv(name, value)
            capsys.readouterr()
            code = main([*args, "--file", str(path), "--url", url])
            out, err = capsys.readouterr()
        return Run(code, out, err)

    return run


def write(topology: Topology, tmp_path: Path) -> Path:
    path = tmp_path / f"{topology.namespace}.yaml"
    path.write_text(yaml.safe_dump(topology.model_dump(mode="json")))
    return path


def park(url: str, topology: Topology, queue: str, message_id: str, headers: dict[str, Any]):
    """Put one delayq message straight into ``queue``'s DLQ, as a consumer would."""
    # The factory checks the key against the topology's bindings: say it is bound elsewhere.
    origin = Topology.model_validate({**topology.model_dump(), "external_bindings": ["orders.#"]})
    with Publisher(url, topology) as pub:
        parked = MessageFactory(origin).build(
            {"order": 7}, "orders.paid", "0s", message_id=message_id, headers=headers
        )
        object.__setattr__(parked, "exchange", "")
        object.__setattr__(parked, "routing_key", f"{queue}.dlq")
        pub.send(parked)


def test_a_message_the_broker_dead_lettered_at_the_delivery_limit_shows_that_reason(
    make_topology, rabbitmq_url, tmp_path, delayq
):
    """Before: reason `-`. The delivery limit (1) is passed by two reject-requeues (which
    every server counts; RabbitMQ 4.3 no longer counts a nack)."""
    ns = make_topology(["1s"]).namespace
    queue = f"{ns}.work"
    topo = Topology(
        namespace=ns,
        ladder=["1s"],
        destinations=[{"queue": queue, "bindings": ["job.#"], "delivery_limit": 1}],
    )
    apply_topology(topo, rabbitmq_url)
    path = write(topo, tmp_path)
    with Publisher(rabbitmq_url, topo) as pub:
        pub.publish({"n": 1}, "job.poison", "1s", message_id="poison")  # via a tier: x-death

    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    try:
        channel = connection.channel()
        rejects = 0
        deadline = time.monotonic() + 20
        while rejects < 2 and time.monotonic() < deadline:
            method, _, _ = channel.basic_get(queue)
            if method is None:
                time.sleep(0.05)
                continue
            channel.basic_reject(method.delivery_tag, requeue=True)
            rejects += 1
        assert rejects == 2
    finally:
        connection.close()
    wait_for(
        lambda: depth(rabbitmq_url, f"{queue}.dlq") == 1, 15, "the DLQ to hold the poison message"
    )

    listing = delayq(path, rabbitmq_url, "dlq", "list", queue)
    assert listing.returncode == 0, listing.stderr
    [row] = [line for line in listing.stdout.splitlines() if line.startswith("poison")]
    assert f"delivery limit ({queue})" in row and "job.poison" in row
    as_json = delayq(path, rabbitmq_url, "dlq", "list", queue, "--json")
    assert as_json.returncode == 0, as_json.stderr
    [message] = json.loads(as_json.stdout)["messages"]
    assert message["reason"] == f"delivery limit ({queue})"
    assert message["routing_key"] == "job.poison"
    shown = delayq(path, rabbitmq_url, "dlq", "show", queue, "poison", "--json")
    assert json.loads(shown.stdout)["reason"] == f"delivery limit ({queue})"


def test_dlq_show_decodes_values_masks_secrets_and_reveals_on_request(
    make_topology, rabbitmq_url, tmp_path, delayq
):
    topo = make_topology(["1s"])
    queue = f"{topo.namespace}.work"
    apply_topology(topo, rabbitmq_url)
    path = write(topo, tmp_path)
    headers = {
        "authorization": "Bearer tok-123",
        "Cookie": "sid=cookie-456",
        "tenant": "acme",
        "big": 1795460784958,
        "raw": b"bytes",
    }
    park(rabbitmq_url, topo, queue, "s-1", headers)

    shown = delayq(path, rabbitmq_url, "dlq", "show", queue, "s-1")
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert "tok-123" not in out and "cookie-456" not in out
    assert "authorization = *** (masked; --reveal shows it)" in out
    assert "Cookie = *** (masked" in out and "tenant = acme" in out
    assert "big = 1795460784958\n" in out and "raw = bytes\n" in out
    assert "L\n" not in out and "b'" not in out  # no Python reprs
    assert "routing_key   orders.paid\n" in out  # the original one, not <queue>.dlq
    assert 'body          {"order":7}' in out

    as_json = json.loads(delayq(path, rabbitmq_url, "dlq", "show", queue, "s-1", "--json").stdout)
    assert (
        as_json["headers"]["authorization"] == "***" and as_json["headers"]["big"] == 1795460784958
    )
    assert sorted(as_json["masked_headers"]) == ["Cookie", "authorization"]
    assert as_json["routing_key"] == "orders.paid" and as_json["body"] == '{"order":7}'

    more = delayq(path, rabbitmq_url, "dlq", "show", queue, "s-1", "--mask-header", "tenant")
    assert "acme" not in more.stdout
    by_env = delayq(
        path, rabbitmq_url, "dlq", "show", queue, "s-1", env={"DELAYQ_MASK_HEADERS": "ten"}
    )
    assert "acme" not in by_env.stdout

    revealed = delayq(path, rabbitmq_url, "dlq", "show", queue, "s-1", "--reveal")
    assert "authorization = Bearer tok-123" in revealed.stdout and "cookie-456" in revealed.stdout


def test_unrouted_list_and_show_give_the_routing_key(make_topology, rabbitmq_url, tmp_path, delayq):
    """A typo'd key lands in <ns>.unrouted; the listing says which key it was."""
    topo = make_topology(["1s"])
    apply_topology(topo, rabbitmq_url)
    path = write(topo, tmp_path)
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    try:  # straight to the ready exchange, as a due message with a key nobody binds
        connection.channel().basic_publish(
            topo.ready_exchange,
            "bda.x",
            b'"typo"',
            pika.BasicProperties(message_id="u-typo", headers={"x-api-key": "k-789"}),
        )
    finally:
        connection.close()
    wait_for(lambda: depth(rabbitmq_url, topo.unrouted) == 1, 15, "the unrouted queue to hold it")
    listing = delayq(path, rabbitmq_url, "unrouted", "list")
    [row] = [line for line in listing.stdout.splitlines() if line.startswith("u-typo")]
    assert "bda.x" in row and "no binding" in row
    [message] = json.loads(delayq(path, rabbitmq_url, "unrouted", "list", "--json").stdout)[
        "messages"
    ]
    assert message["routing_key"] == "bda.x" and message["reason"] == "no binding"
    shown = delayq(path, rabbitmq_url, "unrouted", "show", "u-typo", "--json")
    assert json.loads(shown.stdout)["headers"]["x-api-key"] == "***" and "k-789" not in shown.stdout


def test_listing_into_a_closed_pipe_ends_quietly(make_topology, rabbitmq_url, tmp_path):
    topo = make_topology(["1s"])
    queue = f"{topo.namespace}.work"
    apply_topology(topo, rabbitmq_url)
    path = write(topo, tmp_path)
    park(rabbitmq_url, topo, queue, "p-1", {})
    for args in (["dlq", "list", queue], ["dlq", "show", queue, "p-1"], ["stats"]):
        read, write_end = os.pipe()
        os.close(read)  # as after `| head` exited
        try:
            run = subprocess.run(
                [sys.executable, "-m", "delayq", *args, "--file", str(path), "--url", rabbitmq_url],
                stdout=write_end,
                stderr=subprocess.PIPE,
                text=True,
                timeout=60,
            )
        finally:
            os.close(write_end)
        assert run.returncode == 141 and run.stderr == "", (args, run.stderr)
    assert depth(rabbitmq_url, f"{queue}.dlq") == 1  # browsing removed nothing
