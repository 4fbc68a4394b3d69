"""The apply marker and the two-phase apply, without a broker (issue 12, items 2 and 13).

The same on a real broker: tests/integration/test_apply_marker.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from delayq import (
    ApplyStatus,
    DelayqError,
    Destination,
    InvalidTopology,
    Topology,
    TopologyConflict,
    TopologyMissing,
    TopologyNotApplied,
    build_declarations,
    load_topology,
)
from delayq.cli import EXIT_BROKER, EXIT_OK, main
from delayq.testing import MemoryBroker
from delayq.topology.declarations import ExchangeDecl, QueueDecl, apply_marker
from delayq.topology.definitions import export_definitions

WORK = {"queue": "shop.work", "bindings": ["job.#"]}
SHOP = Topology(namespace="shop", ladder=["1s", "5s"], destinations=[WORK])


def variant(**changes: object) -> Topology:
    return Topology.model_validate({**SHOP.model_dump(), **changes})


# --- the marker's name ---------------------------------------------------------------------


def test_the_marker_is_declared_last_and_exported() -> None:
    marker = build_declarations(SHOP)[-1]
    assert marker == apply_marker(SHOP)
    assert isinstance(marker, ExchangeDecl) and marker.role == "marker"
    assert marker.name.startswith("shop.applied.") and len(marker.name) == len("shop.applied.") + 12
    assert marker.name in {e["name"] for e in export_definitions(SHOP)["exchanges"]}


def test_the_digest_covers_the_namespace_entities_not_the_destinations() -> None:
    same = {
        apply_marker(SHOP).name,
        apply_marker(variant(destinations=[{"queue": "other", "bindings": ["x"]}])).name,
        apply_marker(variant(destinations=[])).name,
        apply_marker(variant(limits={"max_headers": 3})).name,  # no broker entity changes
    }
    assert len(same) == 1
    different = {
        apply_marker(SHOP).name,
        apply_marker(variant(ladder=["1s", "5s", "9s"])).name,
        apply_marker(variant(ladder=["1s"])).name,
        apply_marker(variant(queue_type="classic")).name,
        apply_marker(variant(tier_max_length=10)).name,
        apply_marker(variant(exact={"unit": "1s"})).name,
        apply_marker(SHOP.with_namespace("other")).name.replace("other.", "shop."),
    }
    assert len(different) == 7


# --- the memory broker applies in two phases as the adapters do --------------------------------


def conflicting_tier(broker: MemoryBroker, topology: Topology = SHOP) -> str:
    tier = topology.tier_name(topology.ladder.tiers[-1])
    drop_head = {"x-queue-type": "quorum", "x-overflow": "drop-head", "x-message-ttl": 5000}
    broker.declare(QueueDecl(tier, drop_head))
    return tier


def test_a_conflict_declares_nothing_else_and_publishers_refuse() -> None:
    with MemoryBroker() as broker:
        tier = conflicting_tier(broker)
        with pytest.raises(TopologyConflict, match=r"x-dead-letter-exchange|x-overflow"):
            broker.apply(SHOP)
        report = broker.apply(SHOP, raise_on_conflict=False)
        assert [c.name for c in report.conflicts] == [tier]
        assert report.count(ApplyStatus.SKIPPED) == len(build_declarations(SHOP)) - 1
        assert broker.exchanges() == [] and broker.queues() == [tier]
        with pytest.raises(TopologyNotApplied, match="topology apply"):
            broker.publisher(SHOP).publish(b"x", "job.a", "5s")

        async def publish_async() -> None:
            from delayq.aio import AsyncPublisher

            await AsyncPublisher(broker.url, SHOP).publish(b"x", "job.a", "5s")

        with pytest.raises(TopologyNotApplied):
            asyncio.run(publish_async())
        assert broker.depth(tier) == 0


def test_a_conflict_on_a_namespace_entity_removes_an_earlier_marker() -> None:
    with MemoryBroker() as broker:
        broker.apply(SHOP)
        broker.publisher(SHOP).publish(b"x", "job.a", "1s")
        tier = SHOP.tier_name(SHOP.ladder.tiers[-1])
        broker.delete_queue(tier)
        conflicting_tier(broker)
        report = broker.apply(SHOP, raise_on_conflict=False)
        assert report.marker_removed and [c.name for c in report.conflicts] == [tier]
        with pytest.raises(TopologyNotApplied):
            broker.publisher(SHOP).publish(b"x", "job.a", "1s")


def test_a_conflicting_destination_keeps_the_marker() -> None:
    with MemoryBroker() as broker:
        broker.apply(SHOP)
        other = variant(destinations=[{**WORK, "delivery_limit": 3}])
        report = broker.apply(other, raise_on_conflict=False)
        assert [c.argument for c in report.conflicts] == ["x-delivery-limit"]
        assert not report.marker_removed
        assert broker.publisher(SHOP).publish(b"x", "job.a", "1s")


def test_a_topology_missing_error_still_catches_the_refusal() -> None:
    with MemoryBroker() as broker, pytest.raises(TopologyMissing):
        broker.publisher(SHOP).publish(b"x", "job.a", "1s")


# --- CLI: wording and --quiet ----------------------------------------------------------------


def write(tmp_path: Path, topology: Topology) -> Path:
    import yaml

    path = tmp_path / "topo.yaml"
    path.write_text(yaml.safe_dump(topology.model_dump(mode="json")))
    return path


@pytest.mark.parametrize("quiet", [False, True])
def test_cli_apply_says_one_conflicting_entity_and_quiet_prints_only_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], quiet: bool
) -> None:
    path = write(tmp_path, SHOP)
    with MemoryBroker() as broker:
        tier = conflicting_tier(broker)
        argv = ["topology", "apply", "--file", str(path), "--url", broker.url]
        assert main([*argv, *(["--quiet"] if quiet else [])]) == EXIT_BROKER
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert f"! conflict queue    {tier} [tier]" in out
    assert "1 conflicting entity was left unchanged and nothing else was declared" in err
    assert "entities" not in err
    if quiet:
        assert len(lines) == 3  # the conflict, its explanation, the summary
        assert lines[-1] == f"1 conflict, {len(build_declarations(SHOP)) - 1} skipped"
    else:
        assert lines[0].startswith("applying ") and "- skipped" in out


def test_cli_apply_quiet_prints_only_the_summary_when_all_is_well(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, SHOP)
    with MemoryBroker() as broker:
        argv = ["topology", "apply", "--file", str(path), "--url", broker.url, "-q"]
        assert main(argv) == EXIT_OK
    out = capsys.readouterr().out
    assert out.splitlines() == [out.splitlines()[-1]] and "created" in out


# --- Topology(...) raises delayq errors (item 13) -------------------------------------------


@pytest.mark.parametrize(
    ("build", "words"),
    [
        (lambda: Topology(namespace="bad name"), "namespace 'bad name'"),
        (lambda: Topology(ladder=5), "ladder must be a list"),
        (lambda: Topology(nmespace="x"), "nmespace: Extra inputs"),
        (lambda: Topology(destinations=[{"queue": "q"}]), "destinations.0: destination 'q' has no"),
        (lambda: Topology(destinations=[{"queue": "q", "bindings": ["a b"]}]), "'a b'"),
        (lambda: Destination(queue="q", bindings=[]), "bindings"),
        (lambda: Topology(exact={"unit": 5}), "exact.unit 5 is a bare number"),
        (lambda: SHOP.with_namespace("amq.x"), "reserves"),
        (lambda: Topology.model_validate({"namespace": ""}), "namespace"),
    ],
)
def test_a_bad_topology_is_a_delayq_error(build: object, words: str) -> None:
    with pytest.raises(DelayqError) as caught:
        build()  # type: ignore[operator]
    assert isinstance(caught.value, InvalidTopology) and isinstance(caught.value, ValueError)
    assert words in str(caught.value)


def test_a_key_twice_in_the_yaml_is_refused_not_silently_dropped(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(
        "namespace: shop\n"
        "destinations:\n  - {queue: a, bindings: [a.#]}\n"
        "ladder: [1s]\n"
        "destinations:\n  - {queue: b, bindings: [b.#]}\n"
    )
    twice = r"key 'destinations' appears twice \(lines 2 and 5\)"
    with pytest.raises(InvalidTopology, match=twice):
        load_topology(path)


def test_yaml_merge_keys_may_still_override(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(
        "namespace: shop\n"
        "destinations:\n"
        "  - &a {queue: a, bindings: [a.#]}\n"
        "  - <<: *a\n    queue: b\n"
    )
    topology = load_topology(path)
    assert [d.queue for d in topology.destinations] == ["a", "b"]
