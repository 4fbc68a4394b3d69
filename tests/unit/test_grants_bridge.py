"""The bridge's own role: what ``delayq bridge`` needs, granted apart from the producers'.

Derived as tests/unit/test_grants.py derives the other roles: the bridge's needs from
what its relay plans (a forward into each tier, delay 0 into ready, a park into the
intake's DLQ through ``<ns>.direct``), its consume of the intake queue, and the apply
marker it checks; the real-broker proof is tests/integration/test_grant.py.
"""

from __future__ import annotations

import re

import pytest

from delayq import InvalidInput, Topology
from delayq.intake.relay import Incoming, Relay
from delayq.ops.grant import NOTHING, Role, bridge_grant, grants_for, producer_grant
from tests.unit.test_grants import marker

TOPO = Topology(
    namespace="shop",
    ladder=["30s", "5m"],
    destinations=[{"queue": "emails", "bindings": ["email.*"]}],
    intakes=[{"exchange": "emails.delayed", "type": "topic"}],
)

Need = tuple[str, str]


def bridge_needs(topology: Topology) -> set[Need]:
    needs: set[Need] = set()
    for intake in topology.intakes:
        relay = Relay(topology, intake)
        needs.add(("read", intake.queue_name(topology.namespace)))
        for delay in (0, 1, 30_000, 200_000, "bad"):
            plan = relay.plan(Incoming("email.x", b"{}", {"headers": {"x-delay": delay}}))
            needs.add(("write", plan.message.exchange))
    needs.add(("write", marker(topology).name))  # its passive check (4.2.6+)
    return needs


def allows(pattern: str, name: str) -> bool:
    return re.search(pattern, name) is not None


def test_the_bridge_grant_covers_what_the_bridge_does_and_no_intake_exchange() -> None:
    grant = bridge_grant(TOPO, "relay")
    assert grant.role is Role.BRIDGE and grant.permissions.configure == NOTHING
    for permission, name in sorted(bridge_needs(TOPO)):
        assert allows(getattr(grant.permissions, permission), name), (permission, name)
    assert "shop.direct" in {n for _, n in bridge_needs(TOPO)}  # a park goes there
    assert not allows(grant.permissions.write, "emails.delayed")  # publishers' side
    assert not allows(grant.permissions.read, "emails")  # no destination consumed


def test_with_a_bridge_user_the_producer_keeps_to_the_tiers_and_intakes() -> None:
    grants = {g.role: g for g in grants_for(TOPO, producer="app", consumer=None, bridge="relay")}
    producer = grants[Role.PRODUCER].permissions
    assert allows(producer.write, "emails.delayed") and allows(producer.write, "shop.tier.30s")
    assert not allows(producer.write, "shop.direct")  # which reaches every queue by name
    assert producer.read == NOTHING
    alone = producer_grant(TOPO, "app").permissions  # no bridge user: it may run the bridge
    assert allows(alone.write, "shop.direct") and allows(alone.read, "shop.intake.emails.delayed")


def test_a_bridge_user_without_intakes_or_shared_with_another_role_is_refused() -> None:
    plain = Topology(namespace="shop", destinations=[{"queue": "emails", "bindings": ["e.x"]}])
    with pytest.raises(InvalidInput, match="no intakes"):
        bridge_grant(plain, "relay")
    with pytest.raises(InvalidInput, match="two roles"):
        grants_for(TOPO, producer="app", consumer=None, bridge="app")
