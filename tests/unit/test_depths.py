"""The table and JSON of ``delayq stats``, from depths the adapters report."""

from __future__ import annotations

import json

from delayq import Topology
from delayq.ops.depths import (
    Counted,
    Depth,
    Unseen,
    render_stats,
    stats_json,
    stats_queues,
    stats_rows,
)

TOPO = Topology(
    namespace="shop", ladder=["1s", "5s"], destinations=[{"queue": "emails", "bindings": ["e.*"]}]
)


def test_rows_tiers_then_retries_then_destinations_then_unrouted() -> None:
    rows = stats_rows(TOPO)
    assert [(r.queue, r.role) for r in rows] == [
        ("shop.tier.1s", "tier"),
        ("shop.tier.5s", "tier"),
        ("shop.retry.1s.direct", "retry"),
        ("shop.retry.5s.direct", "retry"),
        ("shop.retry.1s", "retry"),  # the fanout retry tiers of earlier versions
        ("shop.retry.5s", "retry"),
        ("emails", "destination"),
        ("shop.unrouted", "unrouted"),
    ]
    assert rows[6].dlq == "emails.dlq"
    assert stats_queues(rows)[-1] == "emails.dlq"
    assert len(stats_queues(rows)) == 9


def _depths(unacked: int | None) -> dict[str, Counted]:
    depths: dict[str, Counted] = {
        name: Depth(0, unacked if unacked is None else 0, 0)
        for name in stats_queues(stats_rows(TOPO))
    }
    depths["shop.tier.5s"] = Depth(1200, None if unacked is None else 0, 0)
    depths["emails"] = Depth(7, unacked, 2)
    depths["emails.dlq"] = Depth(3, None if unacked is None else 1, 0)
    return depths


def _line(text: str, queue: str) -> list[str]:
    return next(line.split() for line in text.splitlines() if line.startswith(queue + " "))


def test_the_table_from_the_management_api() -> None:
    text = render_stats(stats_rows(TOPO), _depths(unacked=5), "management API http://x/")
    assert text.splitlines()[0] == "# source: management API http://x/"
    assert _line(text, "shop.tier.5s") == ["shop.tier.5s", "tier", "1,200", "1,200", "0", "0", "-"]
    # depth = ready + unacked; the DLQ's depth counts its unacked message too
    assert _line(text, "emails") == ["emails", "destination", "12", "7", "5", "2", "4"]
    assert "AMQP" not in text


def test_the_table_from_amqp_says_unacked_is_unknown() -> None:
    text = render_stats(stats_rows(TOPO), _depths(unacked=None), "AMQP passive declares")
    assert _line(text, "emails") == ["emails", "destination", "7", "7", "?", "2", "3"]
    assert "ready messages only" in text and "lag" in text


def test_missing_queues_are_shown_as_missing() -> None:
    depths = _depths(unacked=0)
    depths["shop.tier.1s"] = None
    depths["emails.dlq"] = None
    text = render_stats(stats_rows(TOPO), depths, "x")
    assert _line(text, "shop.tier.1s") == ["shop.tier.1s", "tier", "missing", "-"]
    assert _line(text, "emails")[-1] == "missing"


def test_queues_this_user_may_not_look_at_are_hidden_never_counted_or_missing() -> None:
    """RabbitMQ 4.2.6+ refuses a passive declare to a user with no permission on the queue:
    the row says so, never 0 nor missing, and the JSON's ``exists`` is unknown."""
    depths = _depths(unacked=None)
    depths["shop.tier.1s"] = Unseen("ACCESS_REFUSED")
    depths["emails.dlq"] = Unseen("ACCESS_REFUSED")
    text = render_stats(stats_rows(TOPO), depths, "AMQP passive declares")
    assert _line(text, "shop.tier.1s") == ["shop.tier.1s", "tier", "hidden", "-"]
    assert _line(text, "emails") == ["emails", "destination", "7", "7", "?", "2", "hidden"]
    assert "this user has no permission on the queue" in text
    queues = {
        q["queue"]: q for q in json.loads(stats_json(stats_rows(TOPO), depths, "x"))["queues"]
    }
    assert queues["shop.tier.1s"] == {
        "queue": "shop.tier.1s", "role": "tier", "exists": None, "hidden": True
    }  # fmt: skip
    assert queues["emails"]["dlq_depth"] is None and queues["emails"]["dlq_hidden"] is True
    assert "hidden" not in render_stats(stats_rows(TOPO), _depths(unacked=None), "x")


def test_a_sharded_total_with_a_hidden_shard_is_hidden_and_with_a_missing_one_missing() -> None:
    topology = Topology(
        namespace="shop", ladder=["1s"], shards=2,
        destinations=[{"queue": "emails", "bindings": ["e.*"]}],
    )  # fmt: skip
    rows = stats_rows(topology)
    total, first, second = rows[0], rows[1], rows[2]
    assert total.shards == (first.queue, second.queue)
    depths: dict[str, Counted] = {name: Depth(1, None, 0) for name in stats_queues(rows)}
    depths[second.queue] = Unseen("refused")
    assert _line(render_stats(rows, depths, "x"), total.label)[-2] == "hidden"
    depths[first.queue] = None
    assert _line(render_stats(rows, depths, "x"), total.label)[-2] == "missing"


def test_json() -> None:
    depths = _depths(unacked=5)
    depths["shop.unrouted"] = None
    data = json.loads(stats_json(stats_rows(TOPO), depths, "management API"))
    assert data["source"] == "management API"
    by_queue = {q["queue"]: q for q in data["queues"]}
    assert by_queue["emails"] == {
        "queue": "emails",
        "role": "destination",
        "exists": True,
        "ready": 7,
        "unacked": 5,
        "consumers": 2,
        "forwarding": None,
        "depth": 12,
        "dlq": "emails.dlq",
        "dlq_depth": 4,
    }
    assert by_queue["shop.unrouted"] == {
        "queue": "shop.unrouted",
        "role": "unrouted",
        "exists": False,
    }


def test_dead_letters_held_by_a_tier_are_flagged() -> None:
    depths = _depths(unacked=0)
    depths["shop.tier.1s"] = Depth(0, 0, 0, forwarding=384)
    text = render_stats(stats_rows(TOPO), depths, "management API http://x/")
    assert "# shop.tier.1s holds 384 dead letters not yet forwarded" in text
    assert "shop.tier.5s holds" not in text
    queues = {
        q["queue"]: q for q in json.loads(stats_json(stats_rows(TOPO), depths, "x"))["queues"]
    }
    assert queues["shop.tier.1s"]["forwarding"] == 384
    assert queues["shop.tier.5s"]["forwarding"] is None


def test_forwarding_is_counted_for_quorum_queues_only() -> None:
    from delayq.sync.depths import _api_depth

    quorum = {
        "type": "quorum",
        "messages": 10,
        "messages_ready": 3,
        "messages_unacknowledged": 2,
        "consumers": 1,
    }
    assert _api_depth(quorum) == Depth(3, 2, 1, forwarding=5)
    assert _api_depth({**quorum, "type": "classic"}).forwarding is None
    assert _api_depth({"type": "quorum", "messages": None}).forwarding == 0


def test_intakes_are_rows_with_their_dlqs_before_unrouted() -> None:
    topo = Topology(
        namespace="shop",
        ladder=["1s"],
        destinations=[{"queue": "emails", "bindings": ["e.*"]}],
        intakes=[{"exchange": "orders.delayed", "type": "topic"}],
    )
    rows = stats_rows(topo)
    intake = rows[-2]
    assert (intake.queue, intake.role) == ("shop.intake.orders.delayed", "intake")
    assert intake.dlq == "shop.intake.orders.delayed.dlq"
    assert rows[-1].role == "unrouted"
    assert "shop.intake.orders.delayed.dlq" in stats_queues(rows)
