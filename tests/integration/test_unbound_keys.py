"""A routing key no binding of the topology matches is refused at publish (issue 12, item 8).

Before: ``delayq publish -k bda.x`` returned a normal receipt and the message
surfaced in ``<ns>.unrouted`` when due. Now the publisher, which knows the
topology, raises ``UnboundRoutingKey`` (an ``Unroutable`` and an ``InvalidInput``)
before anything is sent; ``external_bindings`` declares keys bound elsewhere.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pika
import pytest
import yaml

from delayq import InvalidInput, Message, Topology, UnboundRoutingKey, Unroutable
from delayq.topology.declarations import QueueDecl


def depths(url: str, topology: Topology) -> dict[str, int]:
    """Messages in every queue of the topology: tiers, levels, destinations, unrouted."""
    from delayq import build_declarations

    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        chan = connection.channel()
        return {
            d.name: chan.queue_declare(d.name, passive=True).method.message_count
            for d in build_declarations(topology)
            if isinstance(d, QueueDecl)
        }
    finally:
        connection.close()


@pytest.fixture
def shop(make_topology, driver) -> Topology:
    """Applied: a destination bound to ``bad.#`` and ``orders.paid``, exact levels too."""
    queue = f"k{uuid.uuid4().hex[:10]}"  # make_topology deletes it afterwards
    topo = make_topology(
        ["1s", "5s"],
        destinations=[{"queue": queue, "bindings": ["bad.#", "orders.paid"]}],
        exact={"unit": "500ms", "levels": 4},
    )
    driver.apply(topo)
    return topo


@pytest.mark.parametrize(
    ("delay", "strategy"), [("5s", None), ("0s", None), ("2s", "exact"), ("0s", "exact")]
)
def test_a_typo_is_refused_before_anything_is_sent(
    driver, shop, rabbitmq_url, delay, strategy
):
    with pytest.raises(UnboundRoutingKey) as caught:
        driver.publish(shop, b"typo", "bda.x", delay, strategy=strategy)
    assert isinstance(caught.value, Unroutable) and isinstance(caught.value, InvalidInput)
    assert "did you mean 'bad.x' (bound by 'bad.#')?" in str(caught.value)
    assert set(depths(rabbitmq_url, shop).values()) == {0}


def test_publish_many_with_one_typo_sends_none_of_the_batch(driver, shop, rabbitmq_url):
    batch = [Message({"n": n}, "bad.ok", "1s") for n in range(9)]
    batch.insert(4, Message({"n": "typo"}, "orders.payed", "1s"))
    with pytest.raises(UnboundRoutingKey, match=r"message 4: routing key 'orders\.payed'"):
        driver.publish_many(shop, batch)
    assert set(depths(rabbitmq_url, shop).values()) == {0}


def test_external_bindings_send_a_key_bound_outside_the_topology(
    driver, make_topology, rabbitmq_url, collect
):
    topo = make_topology(["1s"], external_bindings=["audit.#"])
    driver.apply(topo)
    audit = f"{topo.namespace}.audit"  # bound by hand, as another team's queue would be
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    try:
        chan = connection.channel()
        chan.queue_declare(audit, durable=True, arguments={"x-queue-type": "quorum"})
        chan.queue_bind(audit, topo.ready_exchange, "audit.#")
        inbox = collect(audit)
        receipt = driver.publish(topo, b"login", "audit.login", "1s")
        [arrival] = inbox.wait(1, timeout_s=10)
        assert arrival.message_id == receipt.message_id
        with pytest.raises(UnboundRoutingKey):
            driver.publish(topo, b"typo", "audti.login", "1s")
    finally:
        connection.channel().queue_delete(audit)
        connection.close()


def test_cli_publish_of_a_typo_exits_2_and_sends_nothing(shop, rabbitmq_url, tmp_path: Path):
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(shop.model_dump(mode="json")))
    run = subprocess.run(
        [sys.executable, "-m", "delayq", "publish", "-k", "bda.x", "-d", "5s",
         "--file", str(path), "--url", rabbitmq_url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    # 2: bad input, nothing was sent (the CLI's rule), not 1 (the broker refused)
    assert run.returncode == 2, run.stdout + run.stderr
    assert run.stdout == ""
    assert run.stderr.startswith("delayq: error: routing key 'bda.x' matches no binding")
    assert set(depths(rabbitmq_url, shop).values()) == {0}
