"""``delayq dlq show|replay`` by the id ``dlq list`` prints, and a user who may not read
the DLQ (issue 48, items 1 and 4)."""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from delayq import Topology
from delayq.local.node import LocalNode
from delayq.sync import apply_topology, delete_topology
from tests.amqp import depth
from tests.integration.ops import add_user, delayq, delete_user, set_permissions
from tests.integration.test_cli_parked import park, write

LONG = "order-2026-12-06-customer-000042-reminder-{}"  # longer than list's 34 columns


@pytest.fixture
def parked(local_rabbitmq_management_node: LocalNode, tmp_path: Path) -> Iterator[tuple]:
    """A topology on the management node, its file, its destination queue."""
    node = local_rabbitmq_management_node
    ns = f"ids{uuid.uuid4().hex[:8]}"
    topology = Topology(
        namespace=ns, ladder=["1s"], destinations=[{"queue": f"{ns}.work", "bindings": ["o.#"]}]
    )
    apply_topology(topology, node.url)
    try:
        yield node, topology, write(topology, tmp_path), f"{ns}.work"
    finally:
        delete_topology(topology, node.url)


def run(node: LocalNode, path: Path, *args: str, url: str | None = None) -> object:
    return delayq(*args, "--file", str(path), "--url", url or node.url)


def test_show_and_replay_take_the_cut_id_list_prints_or_a_prefix(parked) -> None:
    node, topology, path, queue = parked
    one, two = LONG.format("alpha"), LONG.format("beta")
    park(node.url, topology, queue, one, {})
    park(node.url, topology, queue, two, {})

    listing = run(node, path, "dlq", "list", queue)
    assert listing.returncode == 0, listing.stderr
    cut = [line.split()[0] for line in listing.stdout.splitlines() if line.startswith("order-")]
    assert len(cut) == 2 and all(c.endswith("…") for c in cut), listing.stdout
    # the two cut forms are alike: the shown form names both, and is refused with them
    assert cut[0] == cut[1]
    ambiguous = run(node, path, "dlq", "show", queue, cut[0])
    assert ambiguous.returncode == 2, ambiguous.stderr
    assert "ambiguous" in ambiguous.stderr and one in ambiguous.stderr and two in ambiguous.stderr
    assert "Traceback" not in ambiguous.stderr

    shown = run(node, path, "dlq", "show", queue, one[:-2] + "…")
    assert shown.returncode == 0, shown.stderr
    assert f"message_id    {one}" in shown.stdout
    by_prefix = run(node, path, "dlq", "show", queue, two[:-2] + "...")
    assert by_prefix.returncode == 0 and f"message_id    {two}" in by_prefix.stdout

    refused = run(node, path, "dlq", "replay", queue, "--id", "order-2026")
    assert refused.returncode == 2 and "ambiguous" in refused.stderr, refused.stderr
    assert depth(node.url, f"{queue}.dlq") == 2  # nothing was sent
    replayed = run(node, path, "dlq", "replay", queue, "--id", two[:-1])
    assert replayed.returncode == 0, replayed.stderr
    assert "replayed 1 of 2" in replayed.stdout
    missing = run(node, path, "dlq", "replay", queue, "--id", "nothing-like-it")
    assert missing.returncode == 1 and "not found" in missing.stderr


@pytest.fixture
def reader(local_rabbitmq_management_node: LocalNode) -> Iterator[str]:
    """The URL of a user who may connect to / but configure, write and read nothing."""
    node = local_rabbitmq_management_node
    name, password = f"noread-{uuid.uuid4().hex[:8]}", secrets.token_hex(12)
    add_user(node, name, password)
    set_permissions(node, name, "^$", "^$", "^$")
    try:
        yield f"amqp://{name}:{password}@127.0.0.1:{node.port}/"
    finally:
        delete_user(node, name)


def test_a_user_who_may_not_read_the_dlq_is_told_so_not_that_it_is_empty(
    parked, reader: str
) -> None:
    node, _, path, queue = parked
    replay = run(node, path, "dlq", "replay", queue, "--all", url=reader)
    assert replay.returncode == 1, (replay.stdout, replay.stderr)
    assert "nothing to replay" not in replay.stdout
    assert "access" in replay.stderr.lower() and "Traceback" not in replay.stderr

    listing = run(node, path, "dlq", "list", queue, url=reader)
    assert listing.returncode == 1, (listing.stdout, listing.stderr)
    assert "access" in listing.stderr.lower()
    # the delivery limit it could not check is no news to a user who may not read it
    assert "delivery limit" not in listing.stderr, listing.stderr
