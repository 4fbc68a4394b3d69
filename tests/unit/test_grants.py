"""Least-privilege grants: each role's regexes cover what it uses and nothing else.

RabbitMQ matches permission regexes unanchored (PCRE); delayq anchors them.
Python's ``re.search`` reads these simple patterns the same way.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayq import Topology
from delayq.declarations import BindingDecl, build_declarations
from delayq.grants import NOTHING, Role, consumer_grant, grants_for, producer_grant

TOPO = Topology(
    namespace="shop",
    ladder=["30s", "1h30m", "500ms"],
    destinations=[
        {"queue": "emails", "bindings": ["email.*"]},
        {"queue": "orders.reminders", "bindings": ["orders.#"]},
    ],
)


def matches(pattern: str, name: str) -> bool:
    return re.search(pattern, name) is not None


def entity_names(topology: Topology) -> set[str]:
    return {d.name for d in build_declarations(topology) if not isinstance(d, BindingDecl)}


OUTSIDE = [
    "other.ready",
    "shopx.ready",
    "xshop.ready",
    "shop.readyx",
    "shop.tier.30s.extra",
    "shop.verify.ab12",
    "shop.tier.",
    "emails.extra",
    "emailsx",
    "orders.reminders.dlq.dlq",
    "amq.default",
    "",
]


def test_the_producer_writes_to_the_tiers_and_ready_only() -> None:
    grant = producer_grant(TOPO, "app")
    perms = grant.permissions
    assert perms.configure == NOTHING and perms.read == NOTHING
    tiers = {TOPO.tier_name(t) for t in TOPO.ladder.tiers}
    for name in entity_names(TOPO):
        assert matches(perms.write, name) == (name in tiers | {"shop.ready"}), name
    for name in OUTSIDE:
        assert not matches(perms.write, name), name
    assert not matches(perms.write, "shop.retry.30s")  # retries are the consumers' business


def test_the_consumer_configures_every_entity_of_the_topology_and_nothing_else() -> None:
    perms = consumer_grant(TOPO, "worker").permissions
    for name in entity_names(TOPO):
        assert matches(perms.configure, name), name
    for name in OUTSIDE:
        assert not matches(perms.configure, name), name


def test_the_consumer_writes_where_it_republishes_and_binds() -> None:
    perms = consumer_grant(TOPO, "worker").permissions
    needed = {
        "amq.default",  # retries of delay 0 and dead letters go through the default exchange
        "shop.ready",  # named as dead-letter exchange of the tiers
        "shop.unrouted",  # alternate exchange of ready; its queue is bound
        "emails",
        "orders.reminders",  # bound to ready
        *(TOPO.retry_name(t) for t in TOPO.ladder.tiers),  # republished to, queues bound
        *(TOPO.tier_name(t) for t in TOPO.ladder.tiers),  # queues bound
    }
    for name in needed:
        assert matches(perms.write, name), name
    for name in ["emails.dlq", "orders.reminders.dlq", *OUTSIDE[:-2]]:
        assert not matches(perms.write, name), name


def test_the_consumer_reads_its_queues_and_binding_sources_but_no_dlq() -> None:
    perms = consumer_grant(TOPO, "worker").permissions
    for name in ["emails", "orders.reminders", "shop.ready", "shop.unrouted", "shop.tier.30s"]:
        assert matches(perms.read, name), name
    for name in ["emails.dlq", "orders.reminders.dlq", "amq.default", *OUTSIDE]:
        assert not matches(perms.read, name), name


namespaces = st.from_regex(r"[a-z][a-z0-9_\-]{0,8}(\.[a-z0-9]{1,4})?", fullmatch=True)


@given(namespaces, namespaces)
def test_grants_never_reach_into_another_namespace(ns: str, other: str) -> None:
    if ns == other or other.startswith(ns + ".") or ns.startswith(other + "."):
        return
    mine = Topology(namespace=ns, ladder=["1s", "1m"])
    theirs = Topology(namespace=other, ladder=["1s", "1m"])
    for grant in (producer_grant(mine, "u"), consumer_grant(mine, "u")):
        for pattern in vars(grant.permissions).values():
            for name in entity_names(theirs):
                assert not matches(pattern, name), (pattern, name)


def test_commands_and_bodies() -> None:
    grant = producer_grant(TOPO, "app", vhost="/prod")
    assert grant.role is Role.PRODUCER and grant.vhost == "/prod"
    perms = grant.permissions
    assert grant.rabbitmqctl_args() == [
        "set_permissions",
        "-p",
        "/prod",
        "app",
        perms.configure,
        perms.write,
        perms.read,
    ]
    assert grant.management_body() == {
        "configure": perms.configure,
        "write": perms.write,
        "read": perms.read,
    }
    assert producer_grant(TOPO, "app").vhost == TOPO.vhost


@pytest.mark.parametrize(
    ("producer", "consumer", "roles"),
    [
        ("p", "c", [Role.PRODUCER, Role.CONSUMER]),
        ("p", None, [Role.PRODUCER]),
        (None, "c", [Role.CONSUMER]),
        (None, None, []),
    ],
)
def test_grants_for_whichever_users_are_given(
    producer: str | None, consumer: str | None, roles: list[Role]
) -> None:
    grants = grants_for(TOPO, producer=producer, consumer=consumer)
    assert [g.role for g in grants] == roles


def test_every_grant_explains_each_permission() -> None:
    for grant in (producer_grant(TOPO, "p"), consumer_grant(TOPO, "c")):
        assert [r.split(":")[0] for r in grant.reasons] == ["configure", "write", "read"]
