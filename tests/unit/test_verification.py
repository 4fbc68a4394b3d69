"""The pure judgement of ``delayq topology verify``: versions, flags, entities, bindings, probe."""

from __future__ import annotations

import pytest

from delayq import Topology
from delayq.errors import InvalidInput, TopologyConflict
from delayq.ops.verify import (
    Check,
    Observed,
    Status,
    check_feature_flags,
    check_version,
    check_vhost,
    compare_bindings,
    compare_entity,
    compare_redeclared,
    passed,
    render_checks,
)
from delayq.ops.verify_probe import PROBE_EXPIRES_MS, check_probe, plan_probe
from delayq.topology.declarations import BindingDecl, ExchangeDecl, QueueDecl, build_declarations

TOPO = Topology(
    namespace="shop",
    ladder=["1s", "5s"],
    destinations=[{"queue": "emails", "bindings": ["email.*"]}],
)
CLASSIC = Topology.model_validate({**TOPO.model_dump(), "queue_type": "classic"})
DECLS = build_declarations(TOPO)
TIER_QUEUE = next(d for d in DECLS if isinstance(d, QueueDecl) and d.name == "shop.tier.1s")
READY = next(d for d in DECLS if isinstance(d, ExchangeDecl) and d.name == "shop.ready")
BINDINGS = [d for d in DECLS if isinstance(d, BindingDecl)]
ENABLED = {"quorum_queue": "enabled", "stream_queue": "enabled", "user_limits": "enabled"}


def as_observed(decl: ExchangeDecl | QueueDecl) -> Observed:
    kind = decl.type if isinstance(decl, ExchangeDecl) else decl.arguments["x-queue-type"]
    return Observed(type=str(kind), durable=decl.durable, arguments=dict(decl.arguments))


# --- broker-wide -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "status"),
    [
        ("3.10.8", Status.OK),
        ("3.13.7", Status.OK),
        ("4.0.2", Status.OK),
        ("3.9.29", Status.FAIL),
        ("3.8.0", Status.FAIL),
        ("2.8", Status.FAIL),
        (None, Status.SKIPPED),
        ("unknown", Status.SKIPPED),
    ],
)
def test_version_needs_3_10(version: str | None, status: Status) -> None:
    check = check_version(version)
    assert check.status is status
    if status is Status.FAIL:
        assert "3.10 or newer" in check.detail


def test_feature_flags_enabled() -> None:
    check = check_feature_flags(TOPO, ENABLED, "3.10.8", "")
    assert check.status is Status.OK
    assert "stream_queue enabled" in check.detail


def test_a_disabled_stream_queue_flag_fails_and_says_how_to_enable_it() -> None:
    check = check_feature_flags(TOPO, {**ENABLED, "stream_queue": "disabled"}, "3.10.8", "")
    assert check.status is Status.FAIL
    assert "stream_queue is disabled" in check.detail
    assert "enable_feature_flag" in check.detail


def test_a_flag_unknown_before_4_fails_but_a_graduated_one_on_4_passes() -> None:
    only_quorum = {"quorum_queue": "enabled"}
    assert check_feature_flags(TOPO, only_quorum, "3.10.8", "").status is Status.FAIL
    assert check_feature_flags(TOPO, {}, "4.1.0", "").status is Status.OK


def test_flags_that_cannot_be_listed_are_skipped_with_the_reason() -> None:
    check = check_feature_flags(TOPO, None, "3.10.8", "no management API")
    assert check.status is Status.SKIPPED
    assert "no management API" in check.detail and "AMQP cannot list" in check.detail


def test_flags_are_not_needed_for_a_classic_topology() -> None:
    check = check_feature_flags(CLASSIC, {}, "3.10.8", "")
    assert check.status is Status.SKIPPED


def test_vhost_of_the_url_must_be_the_topologys() -> None:
    assert check_vhost(TOPO, "/").status is Status.OK
    assert check_vhost(TOPO, "/other").status is Status.OK, "no vhost named: the URL's"
    named = TOPO.model_copy(update={"vhost": "/"})
    assert check_vhost(named, "/").status is Status.OK
    wrong = check_vhost(named, "/other")
    assert wrong.status is Status.FAIL and "'/other'" in wrong.detail


# --- entities through the management API ---------------------------------------------------


@pytest.mark.parametrize("decl", [d for d in DECLS if not isinstance(d, BindingDecl)])
def test_every_entity_as_declared_is_ok(decl: ExchangeDecl | QueueDecl) -> None:
    check = compare_entity(decl, as_observed(decl))
    assert check.status is Status.OK, check.detail
    assert check.subject == f"{decl.kind} {decl.name}"


def test_a_missing_entity_fails_and_says_apply() -> None:
    check = compare_entity(TIER_QUEUE, None)
    assert check.status is Status.FAIL
    assert "topology apply" in check.detail


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            {"x-overflow": "drop-head"},
            "x-overflow is 'drop-head', the topology wants 'reject-publish'",
        ),
        ({"x-message-ttl": 1000.0}, "x-message-ttl is 1000.0, the topology wants 1000"),
        ({"x-message-ttl": "1000"}, "x-message-ttl is '1000', the topology wants 1000"),
        ({"x-expires": 60000}, "x-expires=60000 is set, the topology does not set it"),
        (
            {"x-dead-letter-routing-key": "x"},
            "x-dead-letter-routing-key='x' is set, the topology does not set it",
        ),
    ],
)
def test_an_argument_that_differs_is_named_with_both_values(
    change: dict[str, object], expected: str
) -> None:
    observed = as_observed(TIER_QUEUE)
    observed = Observed(observed.type, observed.durable, {**observed.arguments, **change})
    check = compare_entity(TIER_QUEUE, observed)
    assert check.status is Status.FAIL
    assert expected in check.detail
    assert "cannot change this in place" in check.detail


def test_a_missing_argument_is_named() -> None:
    arguments = dict(TIER_QUEUE.arguments)
    del arguments["x-dead-letter-strategy"]
    check = compare_entity(TIER_QUEUE, Observed("quorum", True, arguments))
    assert check.status is Status.FAIL
    assert "x-dead-letter-strategy is not set, the topology wants 'at-least-once'" in check.detail


def test_a_classic_queue_where_quorum_is_wanted_fails_on_its_type() -> None:
    observed = Observed("classic", True, dict(TIER_QUEUE.arguments))
    check = compare_entity(TIER_QUEUE, observed)
    assert check.status is Status.FAIL
    assert "type is 'classic', the topology wants 'quorum'" in check.detail


def test_an_exchange_of_another_type_or_durability_fails() -> None:
    check = compare_entity(READY, Observed("direct", False, dict(READY.arguments)))
    assert check.status is Status.FAIL
    assert "type is 'direct', the topology wants 'topic'" in check.detail
    assert "durable is False" in check.detail


def test_a_missing_alternate_exchange_is_named() -> None:
    check = compare_entity(READY, Observed("topic", True, {}))
    assert check.status is Status.FAIL
    assert "alternate-exchange is not set, the topology wants 'shop.unrouted'" in check.detail


# --- entities over AMQP --------------------------------------------------------------------


def test_redeclared_entity_ok_missing_or_conflicting() -> None:
    assert compare_redeclared(TIER_QUEUE, True, None).status is Status.OK
    missing = compare_redeclared(TIER_QUEUE, False, None)
    assert missing.status is Status.FAIL and "topology apply" in missing.detail
    conflict = TopologyConflict(
        "queue", TIER_QUEUE.name, "x-overflow", "drop-head", "reject-publish"
    )
    failed = compare_redeclared(TIER_QUEUE, True, conflict)
    assert failed.status is Status.FAIL
    assert "x-overflow='drop-head'" in failed.detail and "'reject-publish'" in failed.detail


# --- bindings ------------------------------------------------------------------------------


def _observed_bindings(bindings: list[BindingDecl]) -> dict[str, set[tuple[str, str]]]:
    observed: dict[str, set[tuple[str, str]]] = {}
    for b in bindings:
        observed.setdefault(b.source, set()).add((b.destination, b.routing_key))
    return observed


OWNED = {"shop.unrouted", "shop.tier.1s", "shop.tier.5s", "shop.retry.1s", "shop.retry.5s"}


def test_all_bindings_present() -> None:
    check = compare_bindings(BINDINGS, _observed_bindings(BINDINGS), OWNED)
    assert check.status is Status.OK
    assert f"{len(BINDINGS)} bindings present" in check.detail


def test_a_missing_binding_is_named() -> None:
    observed = _observed_bindings([b for b in BINDINGS if b.destination != "emails"])
    check = compare_bindings(BINDINGS, observed, OWNED)
    assert check.status is Status.FAIL
    assert "2 of" in check.detail and "shop.ready -> emails [email.*]" in check.detail
    assert "shop.direct -> emails [emails]" in check.detail


def test_many_missing_bindings_are_counted_not_all_listed() -> None:
    check = compare_bindings(BINDINGS, {}, OWNED)
    assert check.status is Status.FAIL
    assert f"{len(BINDINGS)} of {len(BINDINGS)} missing" in check.detail
    assert f"and {len(BINDINGS) - 4} more" in check.detail


def test_routing_keys_of_fanout_bindings_do_not_matter() -> None:
    observed = _observed_bindings(BINDINGS)
    observed["shop.tier.1s"] = {("shop.tier.1s", "shop.tier.1s")}  # pika's default key
    assert compare_bindings(BINDINGS, observed, OWNED).status is Status.FAIL
    assert compare_bindings(BINDINGS, observed, OWNED, keyless=OWNED).status is Status.OK
    observed["shop.ready"] = {("emails", "other.key")}  # a topic exchange: keys matter
    check = compare_bindings(BINDINGS, observed, OWNED, keyless=OWNED)
    assert check.status is Status.FAIL and "shop.ready -> emails [email.*]" in check.detail


def test_a_stray_queue_on_a_tier_exchange_fails_but_other_apps_on_ready_do_not() -> None:
    observed = _observed_bindings(BINDINGS)
    observed["shop.ready"].add(("other.app", "other.#"))  # another application: fine
    assert compare_bindings(BINDINGS, observed, OWNED).status is Status.OK
    observed["shop.tier.1s"].add(("spy", ""))
    check = compare_bindings(BINDINGS, observed, OWNED)
    assert check.status is Status.FAIL
    assert "unexpected on delayq's own exchanges: shop.tier.1s -> spy" in check.detail


# --- the probe -----------------------------------------------------------------------------


def test_the_probe_queue_is_wired_like_a_tier() -> None:
    plan = plan_probe(TOPO, "ab12cd34", ttl_ms=250, bound_ms=5000)
    assert plan.queue.name == "shop.verify.ab12cd34"
    assert plan.inbox == "shop.verify.ab12cd34.in"
    assert plan.exchange == "shop.ready" and plan.routing_key == plan.queue.name
    tier_arguments = {**TIER_QUEUE.arguments, "x-message-ttl": 250}
    assert dict(plan.queue.arguments) == {**tier_arguments, "x-expires": PROBE_EXPIRES_MS}
    assert isinstance(plan.queue.arguments["x-message-ttl"], int)


def test_a_classic_topology_probes_a_classic_queue() -> None:
    plan = plan_probe(CLASSIC, "abcd")
    assert plan.queue.arguments["x-queue-type"] == "classic"
    assert "x-dead-letter-strategy" not in plan.queue.arguments


@pytest.mark.parametrize("token", ["", "abc", "XYZ1", "ab-cd", "a" * 33])
def test_a_bad_probe_token_is_refused(token: str) -> None:
    with pytest.raises(InvalidInput):
        plan_probe(TOPO, token)


def test_a_probe_bound_below_one_ms_is_refused() -> None:
    with pytest.raises(InvalidInput):
        plan_probe(TOPO, "abcd", bound_ms=0)


def test_probe_outcomes() -> None:
    plan = plan_probe(TOPO, "abcd", ttl_ms=200, bound_ms=3000)
    ok = check_probe(plan, 420)
    assert ok.status is Status.OK
    assert "quorum queue shop.verify.abcd (TTL 200ms, at-least-once)" in ok.detail
    assert "0.42 s" in ok.detail
    late = check_probe(plan, None)
    assert late.status is Status.FAIL and "within 3s" in late.detail
    assert check_probe(plan, 3001).status is Status.FAIL
    broken = check_probe(plan, None, "exchange 'shop.ready' does not exist")
    assert broken.status is Status.FAIL and "does not exist" in broken.detail


def test_a_probe_queue_left_behind_fails_the_probe_even_if_it_arrived() -> None:
    plan = plan_probe(TOPO, "abcd")
    check = check_probe(plan, 300, leftover="could not delete shop.verify.abcd: refused")
    assert check.status is Status.FAIL
    assert "could not delete" in check.detail and "expires by itself" in check.detail


# --- output --------------------------------------------------------------------------------


def test_the_table_and_the_verdict() -> None:
    checks = [
        Check("broker version", Status.OK, "RabbitMQ 3.10.8"),
        Check("bindings", Status.SKIPPED, "AMQP cannot list bindings"),
        Check("queue shop.tier.1s", Status.FAIL, "missing"),
    ]
    text = render_checks(checks)
    lines = text.splitlines()
    assert lines[0].split() == ["status", "check", "detail"]
    assert lines[1].startswith("OK ") and "RabbitMQ 3.10.8" in lines[1]
    assert lines[2].startswith("SKIPPED ") and "AMQP cannot list bindings" in lines[2]
    assert lines[3].startswith("FAIL ")
    assert lines[-1] == "# 3 checks: 1 OK, 1 FAIL, 1 SKIPPED"
    assert not passed(checks)
    assert passed(checks[:2])
