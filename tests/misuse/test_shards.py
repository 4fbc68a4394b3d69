"""Misuse of ``shards``: a bad count in a topology file, a sharded publish without an id,
and a publisher whose shard count was never applied."""

from __future__ import annotations

import pytest

from delayq import Topology, TopologyNotApplied
from delayq.cli import EXIT_INPUT, main
from delayq.errors import InvalidInput, InvalidTopology
from delayq.sync import Publisher, apply_topology
from delayq.topology.model import load_topology
from delayq.topology.route import Router

BASE = "namespace: shop\nladder: [1s]\ndestinations: [{queue: work, bindings: [job.*]}]\n"


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("0", "from 1 to 64 queues per tier, not 0"),
        ("-3", "not -3"),
        ("100000", "not 100000"),
        ('"4"', "not '4' (str)"),
        ("four", "not 'four' (str)"),
        ("2.5", "not 2.5 (float)"),
        ("yes", "not True (bool)"),
        ("", "not None (NoneType)"),
    ],
)
def test_a_bad_shard_count_in_a_file_is_one_clear_error(value, words, tmp_path, capsys):
    path = tmp_path / "topology.yaml"
    path.write_text(f"{BASE}shards: {value}\n")
    with pytest.raises(InvalidTopology, match="shards: must be") as caught:
        load_topology(path)
    assert words in str(caught.value) and str(path) in str(caught.value)
    # The CLI says the same in one line, exit 2, without reaching any broker.
    assert main(["topology", "plan", "--file", str(path)]) == EXIT_INPUT
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


def test_a_router_asked_for_a_sharded_route_without_an_id_refuses():
    router = Router(Topology.model_validate({"namespace": "shop", "shards": 2}))
    with pytest.raises(InvalidInput, match="2 shards by message id"):
        router.to_destinations(1_000, "job.a")


def test_a_publisher_of_an_unapplied_shard_count_sends_nothing(make_topology, rabbitmq_url):
    two = make_topology(shards=2)
    apply_topology(two, rabbitmq_url)
    three = Topology.model_validate({**two.model_dump(), "shards": 3})
    with pytest.raises(TopologyNotApplied, match="topology apply"):
        with Publisher(rabbitmq_url, three) as publisher:
            publisher.publish("x", "job.a", "1s")
