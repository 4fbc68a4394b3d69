"""Least-privilege grants: each role's regexes cover what it uses and nothing else.

What each role needs is derived here from RabbitMQ's rules (as rabbit_channel
checks them) applied to what delayq does: the admin's declarations, the
consumer's decisions, the producer's publishes. Every need must be granted, and
every alternative of every regex must be needed by something (none superfluous).
The real-broker proof is tests/integration/test_grant.py.

RabbitMQ matches permission regexes unanchored (PCRE); delayq anchors them.
Python's ``re.search`` reads these simple patterns the same way.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayq import Reject, Retry, Topology
from delayq.consume.delivery import Delivery
from delayq.consume.planner import DeliveryPlanner
from delayq.message.factory import MessageFactory
from delayq.ops.grant import (
    NOTHING,
    Grant,
    Role,
    admin_grant,
    consumer_checks,
    consumer_grant,
    grants_for,
    producer_grant,
)
from delayq.ops.verify_probe import plan_probe
from delayq.topology.declarations import BindingDecl, ExchangeDecl, QueueDecl, build_declarations
from delayq.topology.marker import MARKER_ROLE

TOPO = Topology(
    namespace="shop",
    ladder=["30s", "1h30m", "500ms"],
    destinations=[
        {"queue": "emails", "bindings": ["email.*"]},
        {"queue": "orders.reminders", "bindings": ["orders.#"]},
    ],
)
EXACT = Topology.model_validate({**TOPO.model_dump(), "strategy": "exact"})
CASCADE = Topology.model_validate({**TOPO.model_dump(), "exact": {"unit": "1s"}})
"""The cascade declared for publishes that ask for it; retries stay tiered."""

Need = tuple[str, str]
"""(permission, resource name): what RabbitMQ checks before an operation."""


def _x(name: str) -> str:
    return "amq.default" if name == "" else name  # how RabbitMQ names the default exchange


def admin_needs(topology: Topology) -> set[Need]:
    """What ``apply`` asks of RabbitMQ, declaration by declaration."""
    needs: set[Need] = set()
    for decl in build_declarations(topology):
        if isinstance(decl, ExchangeDecl):
            needs.add(("configure", decl.name))
            if "alternate-exchange" in decl.arguments:
                needs |= {("read", decl.name), ("write", str(decl.arguments["alternate-exchange"]))}
        elif isinstance(decl, QueueDecl):
            needs.add(("configure", decl.name))
            if "x-dead-letter-exchange" in decl.arguments:
                dlx = _x(str(decl.arguments["x-dead-letter-exchange"]))
                needs |= {("read", decl.name), ("write", dlx)}
        else:
            needs |= {("write", decl.destination), ("read", decl.source)}
    return needs | probe_needs(topology)


def probe_needs(topology: Topology) -> set[Need]:
    """What ``topology verify``'s probe asks, as delayq.sync.probe does it: declare the
    inbox and bind it, declare the probe queue (dead-lettering), publish into it through
    the default exchange, read the inbox, delete both."""
    plan = plan_probe(topology, "0123abcd")
    dlx = _x(str(plan.queue.arguments["x-dead-letter-exchange"]))
    return {
        ("configure", plan.inbox), ("write", plan.inbox), ("read", plan.exchange),
        ("configure", plan.queue.name), ("read", plan.queue.name), ("write", dlx),
        ("write", "amq.default"), ("read", plan.inbox),
    }  # fmt: skip


def consumer_needs(topology: Topology) -> set[Need]:
    """Consume each destination; publish every message a decision can ask for."""
    needs: set[Need] = set()
    delays = ["0s", *(f"{t.ttl_ms}ms" for t in topology.ladder.tiers), "7s"]
    for dest in topology.destinations:
        needs.add(("read", dest.queue))
        planner = DeliveryPlanner(topology, dest.queue)
        delivery = Delivery(dest.queue, b"x", "k", "m", None, {})
        decisions = [planner.failure(delivery, Retry(d)) for d in delays]
        decisions += [planner.failure(delivery, Reject("no")), planner.deferred(delivery)]
        decisions += [planner.undecodable(delivery, ValueError("?"))]
        for decision in decisions:
            assert decision.message is not None
            needs.add(("write", _x(decision.message.exchange)))
    return needs | check_needs(consumer_checks(topology), needs)


def check_needs(checked: Iterable[ExchangeDecl | QueueDecl], needs: set[Need]) -> set[Need]:
    """A passive declare of a name the role has no other permission on: RabbitMQ 4.2.6+
    wants one (any, since 4.3.x), and delayq grants write."""
    held = {name for _, name in needs}
    return {("write", decl.name) for decl in checked if decl.name not in held}


def marker(topology: Topology) -> ExchangeDecl:
    (found,) = [d for d in build_declarations(topology) if getattr(d, "role", "") == MARKER_ROLE]
    assert isinstance(found, ExchangeDecl)
    return found


def producer_needs(topology: Topology) -> set[Need]:
    factory = MessageFactory(topology)
    delays = ["0s", "1s", "7s", *(f"{t.ttl_ms}ms" for t in topology.ladder.tiers)]
    strategies = ["tiered", "exact"] if topology.exact_enabled else ["tiered"]
    needs = {
        ("write", _x(factory.build(b"x", "email.x", d, strategy=s).exchange))
        for d in delays
        for s in strategies
    }
    return needs | check_needs([marker(topology)], needs)  # the publisher's gate


def granted(grant: Grant, need: Need) -> bool:
    return re.search(getattr(grant.permissions, need[0]), need[1]) is not None


def alternatives(pattern: str) -> list[str]:
    """The top-level alternatives of ``^(?:a|b|...)$``."""
    if pattern == NOTHING:
        return []
    assert pattern.startswith("^(?:") and pattern.endswith(")$"), pattern
    parts, depth, current = [], 0, ""
    for char in pattern[4:-2]:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "|" and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    return [*parts, current]


ROLES = [
    (producer_grant, producer_needs),
    (consumer_grant, consumer_needs),
    (admin_grant, admin_needs),
]


@pytest.mark.parametrize("topology", [TOPO, EXACT, CASCADE], ids=["tiered", "exact", "both"])
@pytest.mark.parametrize(("make", "needs"), ROLES, ids=["producer", "consumer", "admin"])
def test_every_need_is_granted_and_every_alternative_is_needed(make, needs, topology) -> None:
    grant: Grant = make(topology, "u")
    wanted = needs(topology)
    missing = [need for need in sorted(wanted) if not granted(grant, need)]
    assert not missing, missing
    for permission in ("configure", "write", "read"):
        pattern = getattr(grant.permissions, permission)
        for alternative in alternatives(pattern):
            rest = [a for a in alternatives(pattern) if a != alternative]
            narrower = "^(?:" + "|".join(rest) + ")$" if rest else NOTHING
            still = [n for n in wanted if n[0] == permission and re.search(narrower, n[1])]
            assert len(still) < sum(1 for n in wanted if n[0] == permission), (
                f"{grant.role.value}: {permission} alternative {alternative!r} is not needed"
            )


OUTSIDE = [
    "other.ready",
    "shopx.ready",
    "xshop.ready",
    "shop.readyx",
    "shop.tier.30s.extra",
    "shop.verify.ab12",
    "shop.tier.",
    "shop.directx",
    "emails.extra",
    "emailsx",
    "orders.reminders.dlq.dlq",
    "other.work",
]


def test_the_consumer_declares_nothing_and_has_no_way_into_other_queues() -> None:
    perms = consumer_grant(TOPO, "worker").permissions
    assert perms.configure == NOTHING  # cannot declare, nor delete tiers, retries, ready
    # The default exchange and the retry tiers' fanouts route any routing key to any
    # queue of the vhost (the retry queues dead-letter through the default exchange).
    no_write = ["amq.default", "", "shop.ready", "shop.unrouted", "emails"]
    no_write += [TOPO.retry_name(t) for t in TOPO.ladder.tiers]
    no_write += [TOPO.tier_name(t) for t in TOPO.ladder.tiers]
    for name in [*no_write, *OUTSIDE]:
        assert not re.search(perms.write, name), name
    for name in ["emails.dlq", "orders.reminders.dlq", "shop.ready", "amq.default", *OUTSIDE]:
        assert not re.search(perms.read, name), name


def test_the_direct_exchanges_route_the_topologys_queue_names_only() -> None:
    """What the consumer may write to can reach this topology's queues and DLQs alone."""
    writable = {d.name for d in build_declarations(TOPO) if isinstance(d, ExchangeDecl)}
    writable = {x for x in writable if re.search(consumer_grant(TOPO, "c").permissions.write, x)}
    # the apply marker, which the consumer checks, is bound to nothing: it reaches no queue
    sources = {d.source for d in build_declarations(TOPO) if isinstance(d, BindingDecl)}
    assert marker(TOPO).name not in sources
    writable.discard(marker(TOPO).name)
    assert writable == {"shop.direct", *(f"{TOPO.retry_name(t)}.direct" for t in TOPO.ladder.tiers)}
    ours = {d.queue for d in TOPO.destinations} | {d.dlq for d in TOPO.destinations}
    for decl in build_declarations(TOPO):
        if isinstance(decl, BindingDecl) and decl.source in writable:
            assert decl.routing_key in ours, decl.name
        if isinstance(decl, ExchangeDecl) and decl.name in writable:
            assert decl.type == "direct" and "alternate-exchange" not in decl.arguments
    # Where those messages wait, dead-lettering keeps their routing keys (a CC header's
    # too): only through <ns>.direct, or with one fixed key (the destination's DLQ).
    reached = {
        d.destination
        for d in build_declarations(TOPO)
        if isinstance(d, BindingDecl) and d.source in writable
    }
    for decl in build_declarations(TOPO):
        if isinstance(decl, QueueDecl) and decl.name in reached:
            dlx = decl.arguments.get("x-dead-letter-exchange")
            fixed = "x-dead-letter-routing-key" in decl.arguments
            assert dlx is None or dlx == "shop.direct" or fixed, decl


def test_the_producer_writes_to_the_tiers_and_ready_only() -> None:
    perms = producer_grant(TOPO, "app").permissions
    assert perms.configure == NOTHING and perms.read == NOTHING
    for name in ["shop.retry.30s", "shop.retry.30s.direct", "shop.direct", "amq.default"]:
        assert not re.search(perms.write, name), name


namespaces = st.from_regex(r"[a-z][a-z0-9_\-]{0,8}(\.[a-z0-9]{1,4})?", fullmatch=True)


def entity_names(topology: Topology) -> set[str]:
    return {d.name for d in build_declarations(topology) if not isinstance(d, BindingDecl)}


@given(namespaces, namespaces)
def test_grants_never_reach_into_another_namespace(ns: str, other: str) -> None:
    if ns == other or other.startswith(ns + ".") or ns.startswith(other + "."):
        return
    mine = Topology(namespace=ns, ladder=["1s", "1m"])
    theirs = Topology(namespace=other, ladder=["1s", "1m"])
    for make in (producer_grant, consumer_grant, admin_grant):
        grant = make(mine, "u")
        for pattern in vars(grant.permissions).values():
            for name in entity_names(theirs):
                assert not re.search(pattern, name), (grant.role, pattern, name)


def test_commands_and_bodies() -> None:
    grant = admin_grant(TOPO, "ops", vhost="/prod")
    assert grant.role is Role.ADMIN and grant.vhost == "/prod"
    perms = grant.permissions
    assert grant.rabbitmqctl_args() == [
        "set_permissions",
        "-p",
        "/prod",
        "ops",
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
    ("producer", "consumer", "admin", "roles"),
    [
        ("p", "c", "a", [Role.PRODUCER, Role.CONSUMER, Role.ADMIN]),
        ("p", None, None, [Role.PRODUCER]),
        (None, "c", None, [Role.CONSUMER]),
        (None, None, "a", [Role.ADMIN]),
        (None, None, None, []),
    ],
)
def test_grants_for_whichever_users_are_given(
    producer: str | None, consumer: str | None, admin: str | None, roles: list[Role]
) -> None:
    grants = grants_for(TOPO, producer=producer, consumer=consumer, admin=admin)
    assert [g.role for g in grants] == roles


def test_every_grant_explains_each_permission() -> None:
    for grant in grants_for(TOPO, producer="p", consumer="c", admin="a"):
        assert [r.split(":")[0] for r in grant.reasons] == ["configure", "write", "read"]


def test_a_consumer_checks_only_names_its_grant_covers() -> None:
    """RabbitMQ 4.2.6+ refuses a passive declare of a name the user has no permission on:
    every name a least-privilege consumer checks is one its grant names; the marker
    stands for the namespace's own exchanges and queues, which it may not touch."""
    for topology in (TOPO, EXACT, CASCADE):
        perms = consumer_grant(topology, "c").permissions
        checked = consumer_checks(topology)
        names = {d.name for d in checked}
        assert marker(topology).name in names
        assert {d.queue for d in topology.destinations} <= names
        assert {d.dlq for d in topology.destinations} <= names
        assert topology.direct_exchange in names
        for decl in checked:
            assert any(re.search(p, decl.name) for p in (perms.write, perms.read)), decl.name
        assert not {topology.ready_exchange, topology.unrouted} & names
