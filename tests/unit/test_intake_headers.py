"""Headers intakes, no broker: the model's refusals, the declarations (the headers
exchange, its alternate, the tables as binding arguments), the apply marker of a
topology without headers unchanged, verify's comparison of tables, the grant, the
memory broker's routing, the bridge's plan for a message without a routing key, and
``migrate plan`` of a headers plugin exchange."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from delayq import Topology, build_declarations
from delayq.errors import InvalidInput, InvalidTopology
from delayq.intake import Forward, Incoming, Relay
from delayq.ops.grant import admin_grant, consumer_grant, producer_grant
from delayq.ops.migrate import plan_migration
from delayq.ops.verify import Status, compare_bindings
from delayq.testing import MemoryBroker
from delayq.topology.declarations import BindingDecl, ExchangeDecl, describe
from delayq.topology.definitions import export_definitions
from delayq.topology.headers import table_matches, table_text

ALL = {"x-match": "all", "tenant": "acme", "region": "eu"}
ANY = {"x-match": "any", "vip": True, "priority": 9}


def _topology(**extra: Any) -> Topology:
    data: dict[str, Any] = {
        "namespace": "hq",
        "ladder": ["1s", "5s"],
        "destinations": [
            {"queue": "eu-acme", "headers": [ALL]},
            {"queue": "urgent", "headers": [ANY, {"kind": "page"}]},
        ],
        "intakes": [{"exchange": "plugin", "type": "headers"}],
        **extra,
    }
    return Topology.model_validate(data)


def test_a_headers_intake_declares_a_headers_exchange_fed_by_ready_with_unrouted_as_alternate() -> (
    None
):
    decls = build_declarations(_topology())
    exchanges = {d.name: d for d in decls if isinstance(d, ExchangeDecl)}
    assert exchanges["hq.headers"].type == "headers"
    assert exchanges["hq.headers"].arguments == {"alternate-exchange": "hq.unrouted"}
    bindings = [d for d in decls if isinstance(d, BindingDecl)]
    assert BindingDecl("hq.ready", "hq.headers", "#", destination_type="exchange") in bindings
    tables = [(b.destination, dict(b.arguments)) for b in bindings if b.source == "hq.headers"]
    assert tables == [("eu-acme", ALL), ("urgent", ANY), ("urgent", {"kind": "page"})]
    assert not [b for b in bindings if b.source == "hq.ready" and b.destination_type == "queue"]
    shown = [describe(b) for b in bindings if b.source == "hq.headers"]
    assert shown[0] == (
        "binding  hq.headers -> eu-acme headers={region='eu', tenant='acme', x-match='all'}"
    )
    assert "priority=9, vip=true, x-match='any'" in shown[1]


def test_the_exact_cascade_feeds_the_headers_exchange_routes_only_never_retry_addresses() -> None:
    decls = build_declarations(_topology(exact={"unit": "1s", "levels": 3}))
    into = [d for d in decls if isinstance(d, BindingDecl) and d.destination == "hq.headers"]
    assert {(b.source, b.routing_key) for b in into} == {
        ("hq.ready", "#"),
        ("hq.delivery", "*.*.*.r.#"),
    }


def test_a_topology_without_headers_keeps_its_declarations_and_apply_marker() -> None:
    plain = Topology(
        namespace="hq",
        destinations=[{"queue": "q", "bindings": ["a.b"]}],
        exact={"unit": "1s"},
        intakes=[{"exchange": "d"}],
    )
    decls = build_declarations(plain)
    assert not any(d.name == "hq.headers" for d in decls)
    assert all(not d.arguments for d in decls if isinstance(d, BindingDecl))
    # Pinned (computed before bindings had `arguments`): a marker must not change with
    # the field, or every publisher of an applied topology would refuse to send until
    # the next apply.
    assert decls[-1].name == "hq.applied.71dd6c08f8e1"


def test_the_definitions_export_carries_the_tables_as_binding_arguments() -> None:
    exported = export_definitions(_topology())
    rows = [b for b in exported["bindings"] if b["source"] == "hq.headers"]
    assert [r["arguments"] for r in rows] == [ALL, ANY, {"kind": "page"}]
    exchange = next(e for e in exported["exchanges"] if e["name"] == "hq.headers")
    assert exchange["type"] == "headers"


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"destinations": [{"queue": "q", "bindings": ["a"]}]}, "'q' binds routing keys"),
        (
            {"destinations": [{"queue": "q", "headers": [ALL], "bindings": ["a"]}]},
            "'q' binds routing keys",
        ),
        (
            {"intakes": [{"exchange": "plugin", "type": "headers"}, {"exchange": "d"}]},
            "intake 'd' is direct",
        ),
        ({"external_bindings": ["#"]}, "external_bindings name routing keys"),
        ({"destinations": [{"queue": "q"}]}, "no bindings (routing keys) and no headers"),
        ({"destinations": [{"queue": "q", "headers": [{"x-match": "some"}]}]}, "x-match must"),
        ({"destinations": [{"queue": "q", "headers": [{"x-match": "any"}]}]}, "matches no"),
        ({"destinations": [{"queue": "q", "headers": [{"x-delay": 5}]}]}, "ignores 'x-' keys"),
        ({"destinations": [{"queue": "q", "headers": [{"delayq-tier": "1s"}]}]}, "envelope"),
        ({"destinations": [{"queue": "q", "headers": [{"n": 1.5}]}]}, "headers.0.n"),
        ({"destinations": [{"queue": "q", "headers": [{"n": 2**63}]}]}, "64 bits"),
        ({"destinations": [{"queue": "q", "headers": [{"a": "b"}, {"a": "b"}]}]}, "twice"),
        ({"destinations": [{"queue": "hq.headers", "headers": [{"a": "b"}]}]}, "reserves"),
    ],
)
def test_what_a_headers_namespace_cannot_route_is_refused_naming_it(
    change: dict[str, Any], said: str
) -> None:
    with pytest.raises(InvalidTopology, match=re.escape(said)):
        _topology(**change)


def test_with_x_modes_may_name_x_headers_and_an_empty_all_table_takes_every_message() -> None:
    topo = _topology(
        destinations=[
            {"queue": "q", "headers": [{"x-match": "all-with-x", "x-tag": "t"}, {}]},
        ]
    )
    assert topo.destinations[0].headers[1] == {}
    assert table_text({}) == "{x-match='all'}"


def test_table_matching_ignores_headers_the_table_does_not_name() -> None:
    headers = {"tenant": "acme", "region": "eu", "delayq-tier": "1s", "x-delay": -1000}
    assert table_matches(ALL, headers)
    assert not table_matches(ALL, {"tenant": "acme"})
    assert table_matches(ANY, {"vip": True, "delayq-attempt": 1})
    assert not table_matches(ANY, {"vip": 1, "priority": "9"})  # exact types
    assert table_matches({}, {})
    assert not table_matches({"x-match": "all-with-x", "x-tag": "t"}, {"tag": "t"})
    assert table_matches({"x-match": "any-with-x", "x-tag": "t"}, {"x-tag": "t"})


def test_verify_compares_tables_and_names_a_missing_one() -> None:
    topo = _topology()
    expected = [d for d in build_declarations(topo) if isinstance(d, BindingDecl)]
    observed: dict[str, set[tuple[str, str]]] = {}
    for b in expected:
        match = table_text(b.arguments) if b.source == "hq.headers" else b.routing_key
        observed.setdefault(b.source, set()).add((b.destination, match))
    assert compare_bindings(expected, observed, ()).status is Status.OK
    observed["hq.headers"].discard(("urgent", table_text({"kind": "page"})))
    observed["hq.headers"].add(("urgent", table_text({"kind": "pager"})))
    check = compare_bindings(expected, observed, ())
    assert check.status is Status.FAIL
    assert "hq.headers -> urgent [{kind='page', x-match='all'}]" in check.detail


def test_only_the_admin_grant_names_the_headers_exchange() -> None:
    topo = _topology()
    admin = admin_grant(topo, "admin").permissions
    assert all("hq\\.headers" in p for p in (admin.configure, admin.write, admin.read))
    for grant in (producer_grant(topo, "p"), consumer_grant(topo, "c")):
        assert "headers" not in json.dumps(grant.permissions.__dict__)
    plain = Topology(namespace="hq", destinations=[{"queue": "q", "bindings": ["a"]}])
    assert "headers" not in admin_grant(plain, "admin").permissions.configure


def test_the_memory_broker_routes_by_tables_once_per_queue_and_parks_the_rest() -> None:
    topo = _topology()
    broker = MemoryBroker()
    broker.apply(topo)
    both = {"tenant": "acme", "region": "eu", "vip": True, "kind": "page"}
    # Through a tier: dead-lettered into hq.ready with its headers (and x-death) when due.
    assert broker.publish("hq.tier.1s", "", b"1", headers=both) == ["hq.tier.1s"]
    assert broker.messages("eu-acme") == []
    broker.advance("1s")
    assert sorted(broker.publish("hq.ready", "any.key", b"2", headers={"priority": 9})) == [
        "urgent"
    ]
    assert broker.publish("hq.ready", "", b"3", headers={"tenant": "acme"}) == ["hq.unrouted"]
    assert [m.body for m in broker.messages("eu-acme")] == [b"1"]
    assert [m.body for m in broker.messages("urgent")] == [b"1", b"2"]  # two tables, one copy
    assert [m.body for m in broker.messages("hq.unrouted")] == [b"3"]


def test_the_bridge_schedules_a_message_without_a_routing_key() -> None:
    topo = _topology()
    relay = Relay(topo, topo.intakes[0], clock_ms=lambda: 1_000_000)
    plan = relay.plan(
        Incoming("", b"{}", {"headers": {"x-delay": 1000, "tenant": "acme"}, "message_id": "m"})
    )
    assert isinstance(plan, Forward)
    assert plan.message.exchange == "hq.tier.1s" and plan.message.routing_key == ""
    assert plan.message.headers["tenant"] == "acme" and plan.message.headers["x-delay"] == -1000


def _bind(destination: str, arguments: dict[str, Any], kind: str = "queue") -> dict[str, Any]:
    return {
        "source": "events.delayed",
        "vhost": "/",
        "destination": destination,
        "destination_type": kind,
        "routing_key": "",
        "arguments": arguments,
    }


def _definitions() -> dict[str, Any]:
    plugin = {
        "name": "events.delayed",
        "vhost": "/",
        "type": "x-delayed-message",
        "arguments": {"x-delayed-type": "headers"},
    }
    bindings = [_bind("eu", ALL), _bind("pager", ANY), _bind("pager", ANY)]
    bindings.append(_bind("audit", {"audit": True}, kind="exchange"))
    return {"exchanges": [plugin], "bindings": bindings}


def test_migrate_plans_a_headers_exchange_as_a_headers_intake_with_tables() -> None:
    (plan,) = plan_migration(_definitions())
    topo = plan.topology
    assert topo.intakes[0].type == "headers" and topo.intakes[0].exchange == "events.delayed.intake"
    assert [(d.queue, d.headers, d.existing) for d in topo.destinations] == [
        ("eu", (ALL,), True),
        ("pager", (ANY,), True),
    ]
    step = next(s for s in plan.steps if "'audit'" in s)
    assert 'delayq.events.delayed.headers with arguments {"audit": true}' in step


def test_migrate_refuses_a_table_delayq_cannot_bind_naming_the_exchange() -> None:
    definitions = _definitions()
    definitions["bindings"][0]["arguments"] = {"x-match": "any"}
    with pytest.raises(InvalidInput, match=r"'events\.delayed' cannot become.*matches no message"):
        plan_migration(definitions)


def test_migrate_still_refuses_arguments_on_a_binding_of_another_type() -> None:
    definitions = _definitions()
    definitions["exchanges"][0]["arguments"] = {"x-delayed-type": "direct"}
    with pytest.raises(InvalidInput, match="does not match on"):
        plan_migration(definitions)
