"""One vhost rule for every command that takes a topology file and a URL (issue 29).

A file that names another vhost than the URL's is refused by each of them: exit 2,
apply's message naming both vhosts, and nothing done (no output, no connection that
changes anything, no store opened, no Spark session started). A file that names no
vhost takes the URL's, in every command alike: ``topology verify`` passes there, and
``grant`` grants there.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from delayq import InvalidInput, Topology
from delayq.cli import EXIT_INPUT, EXIT_OK, main
from delayq.local.node import LocalNode
from delayq.ops.verify import Status
from delayq.sync import apply_topology, delete_topology, verify_topology
from delayq.sync.parking import replay
from delayq.topology.model import load_topology
from tests.integration.test_apply_marker import channel, depth
from tests.integration.test_readme_examples import VHost
from tests.waiting import wait_for

DEAD_URL = "amqp://guest:guest@127.0.0.1:1/"  # refuses connections: nothing is contacted
REFUSAL = "the topology names vhost '/nosuch', the URL connects to vhost '/'"


@dataclass
class Placed:
    """A topology applied in ``/`` with a message parked in its DLQ and one in unrouted;
    ``file`` is that topology with ``vhost: /nosuch``."""

    topology: Topology
    file: Path
    url: str
    management_url: str
    tmp: Path

    @property
    def queue(self) -> str:
        return self.topology.destinations[0].queue

    def parked(self) -> tuple[int, int]:
        return depth(self.url, f"{self.queue}.dlq"), depth(self.url, self.topology.unrouted)


@pytest.fixture
def placed(local_rabbitmq_management_node: LocalNode, tmp_path: Path) -> Iterator[Placed]:
    node = local_rabbitmq_management_node
    assert node.management_url is not None
    ns = f"v{uuid.uuid4().hex[:10]}"
    topology = Topology(
        namespace=ns,
        ladder=["1s"],
        destinations=[{"queue": f"{ns}.work", "bindings": ["job.#"]}],
        intakes=[{"exchange": f"legacy-{ns}", "type": "topic"}],
    )
    assert apply_topology(topology, node.url).ok
    with channel(node.url) as chan:
        chan.confirm_delivery()  # each publish returns once the broker has it
        for queue in (f"{ns}.work.dlq", topology.unrouted):
            chan.basic_publish("", queue, b"parked", pika_properties(f"{ns}-parked"))
    file = tmp_path / "topology.yaml"
    file.write_text(yaml.safe_dump({**topology.model_dump(mode="json"), "vhost": "/nosuch"}))
    here = Placed(topology, file, node.url, node.management_url, tmp_path)
    try:
        # A quorum queue's count can trail its confirm on 4.x: wait for it to say so.
        wait_for(lambda: here.parked() == (1, 1), 30, lambda: f"(1, 1) parked, not {here.parked()}")
        yield here
    finally:
        delete_topology(topology, node.url)


def pika_properties(message_id: str) -> Any:
    import pika

    return pika.BasicProperties(message_id=message_id, delivery_mode=2)


def _spark_input(p: Placed) -> str:
    rows = p.tmp / "rows.jsonl"
    rows.write_text('{"key": "a", "routing_key": "job.a", "delay": "1s", "body": "x"}\n')
    return str(rows)


def _stream_input(p: Placed) -> list[str]:
    (p.tmp / "incoming").mkdir(exist_ok=True)
    return [
        "--input",
        str(p.tmp / "incoming"),
        "--format",
        "json",
        "--checkpoint",
        str(p.tmp / "checkpoint"),
        "--schema",
        "key string, routing_key string, delay string",
        "--delay-col",
        "delay",
    ]


COMMANDS: dict[str, Callable[[Placed], list[str]]] = {
    "stats (management API)": lambda p: ["stats", "--management-url", p.management_url],
    "stats (AMQP)": lambda p: ["stats", "--no-management"],
    "publish": lambda p: ["publish", "-k", "job.a", "-d", "1s"],
    "topology apply": lambda p: ["topology", "apply"],
    "topology verify": lambda p: ["topology", "verify", "--management-url", p.management_url],
    "topology grant": lambda p: ["topology", "grant", "--producer-user", "app"],
    "topology heal": lambda p: ["topology", "heal", "--management-url", p.management_url],
    "dlq list": lambda p: ["dlq", "list", p.queue],
    "dlq show": lambda p: ["dlq", "show", p.queue, f"{p.topology.namespace}-parked"],
    "dlq replay": lambda p: ["dlq", "replay", p.queue, "--all"],
    "dlq purge": lambda p: ["dlq", "purge", p.queue, "--yes"],
    "unrouted list": lambda p: ["unrouted", "list"],
    "unrouted replay": lambda p: ["unrouted", "replay", "--all"],
    "unrouted purge": lambda p: ["unrouted", "purge", "--yes"],
    "migrate check": lambda p: ["migrate", "check"],
    "bridge": lambda p: ["bridge"],
    "reschedule": lambda p: [
        "reschedule",
        "--message-id",
        "m1",
        "--body",
        '"x"',
        "-d",
        "1s",
        "-k",
        "job.a",
        "--store",
        f"sqlite:///{p.tmp / 'store.db'}",
    ],
    "spark schedule": lambda p: ["spark", "schedule", _spark_input(p), "--delay-col", "delay"],
    "spark stream": lambda p: ["spark", "stream", *_stream_input(p)],
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_file_naming_another_vhost_is_refused_before_anything_is_done(
    command: str,
    placed: Placed,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue 29: stats and dlq/unrouted list/show/purge read the URL's vhost and never
    looked at the file's; grant granted on the file's; heal watched the file's vhost over
    the API; verify and migrate check called the mismatch a failed check (exit 1); apply
    and bridge said what they would do first; reschedule opened its store first (here:
    refused a missing one), Spark started its session. publish and replay were refused
    by their publisher already: kept here so that none of them regresses."""

    def no_spark(args: Any) -> Any:
        raise AssertionError("a Spark session was started for a refused command")

    monkeypatch.setattr("delayq.cli.spark._spark_session", no_spark)
    argv = [*COMMANDS[command](placed), "--file", str(placed.file), "--url", placed.url]
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == EXIT_INPUT, (code, out, err)
    assert REFUSAL in err and "path /%2Fnosuch" in err, err
    assert out == "", out  # refused before saying it would do anything
    assert placed.parked() == (1, 1)  # nothing browsed away, replayed or purged in "/"
    assert not (placed.tmp / "store.db").exists()  # the refusal came before the store
    assert not (placed.tmp / "checkpoint").exists()


@pytest.fixture
def shop(local_rabbitmq_management_node: LocalNode) -> Iterator[VHost]:
    host = VHost(local_rabbitmq_management_node, f"/shop-{uuid.uuid4().hex[:8]}").create()
    try:
        yield host
    finally:
        host.delete()


def test_a_file_naming_no_vhost_takes_the_urls_in_every_command(
    shop: VHost, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 29: a topology naming no vhost applied, published and consumed on a
    ``/%2Fshop`` URL, but `topology verify` (and verify_topology) compared the URL's
    vhost with the default "/" and failed, and `topology grant` granted on "/"."""
    ns = f"v{uuid.uuid4().hex[:10]}"
    file = tmp_path / "topology.yaml"
    file.write_text(
        yaml.safe_dump(
            {
                "namespace": ns,
                "ladder": ["1s"],
                "destinations": [{"queue": f"{ns}.work", "bindings": ["job.#"]}],
            }
        )
    )
    on = ["--file", str(file), "--url", shop.url]
    assert main(["topology", "apply", *on]) == EXIT_OK
    capsys.readouterr()

    code = main(["topology", "verify", "--json", "--management-url", shop.management_url, *on])
    out, err = capsys.readouterr()
    assert code == EXIT_OK, (out, err)
    checks = {c["subject"]: c for c in json.loads(out)["checks"]}
    assert checks["vhost"]["status"] == "OK" and shop.name in checks["vhost"]["detail"], checks
    unnamed = load_topology(file)
    assert unnamed.declared_vhost is None
    (vhost,) = [c for c in verify_topology(unnamed, shop.url, probe=False) if c.subject == "vhost"]
    assert vhost.status is Status.OK, vhost

    assert main(["topology", "grant", "--producer-user", "app", *on]) == EXIT_OK
    out, _ = capsys.readouterr()
    assert f"# producer 'app' on vhost {shop.name!r}" in out, out
    assert f"set_permissions -p {shop.name} app" in out, out

    assert main(["stats", "--management-url", shop.management_url, *on]) == EXIT_OK
    out, _ = capsys.readouterr()
    assert f"(vhost {shop.name!r})" in out and f"{ns}.work" in out, out


def test_a_replay_naming_another_vhost_is_refused_before_the_queue_is_opened() -> None:
    """Issue 29: :func:`delayq.sync.parking.replay` opened the parking queue (taking its
    messages in hand) and refused only when its publisher opened."""
    topology = Topology(namespace="vhostless", vhost="/nosuch")
    with pytest.raises(InvalidInput, match="names vhost '/nosuch'"):
        replay(DEAD_URL, "vhostless.unrouted", topology, target=lambda parked: ("", "q"))
