"""A destination declared ``existing: true`` (an application's own queue, which delayq
binds and never creates) that is not there yet: ``apply`` says to create it, where it
said the delayq topology was not applied and to run the very command that had failed
(the plugin guide's steps on a fresh broker, an outside tester)."""

from __future__ import annotations

import uuid
from typing import Any

import pika
import pytest
import yaml

from delayq import Topology, TopologyMissing
from delayq.sync import delete_topology
from tests.integration.ops import delayq


def _topology(ns: str) -> Topology:
    return Topology(
        namespace=ns, ladder=["1s"],
        destinations=[{"queue": f"{ns}-app.jobs", "bindings": ["job.a"], "existing": True}],
    )  # fmt: skip


def test_apply_says_to_create_an_existing_queue_that_is_missing(
    driver: Any, rabbitmq_url: str
) -> None:
    topology = _topology(f"o{uuid.uuid4().hex[:10]}")
    queue = topology.destinations[0].queue
    try:
        with pytest.raises(TopologyMissing, match="existing: true") as caught:
            driver.apply(topology)
        assert "Create it" in str(caught.value) and repr(queue) in str(caught.value)
        connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
        connection.channel().queue_declare(queue, durable=True)  # the application's own
        connection.close()
        driver.apply(topology)  # now it binds
    finally:
        delete_topology(topology, rabbitmq_url)
        connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
        connection.channel().queue_delete(queue)
        connection.close()


def test_the_cli_says_so_and_exits_1(rabbitmq_url: str, tmp_path: Any) -> None:
    topology = _topology(f"o{uuid.uuid4().hex[:10]}")
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(topology.model_dump(mode="json")))
    try:
        run = delayq("topology", "apply", "-f", str(path), "--url", rabbitmq_url)
        assert run.returncode == 1, run.stdout + run.stderr
        assert "existing: true" in run.stderr and "Create it" in run.stderr, run.stderr
        assert "Traceback" not in run.stderr
    finally:
        delete_topology(topology, rabbitmq_url)
