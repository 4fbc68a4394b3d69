"""The schedule index beside the tier queues (``delayq stats --index``), pure: equal
counts agree, a tier holding fewer than the index shows waiting is said, a tier whose
queue could not be counted shows '?', and a tier the ladder lost is named."""

from __future__ import annotations

from delayq import Topology
from delayq.ops.depths import Depth, Unseen
from delayq.schedule.beside import beside, beside_json, beside_table

TOPOLOGY = Topology(
    namespace="shop", ladder=["1m", "1h"], destinations=[{"queue": "o", "bindings": ["o.*"]}]
)


def test_counts_side_by_side_and_what_disagrees() -> None:
    depths = {
        "shop.tier.1m": Depth(ready=5, unacked=None, consumers=0),
        "shop.tier.1h": Unseen("ACCESS_REFUSED"),
    }
    rows = beside(TOPOLOGY, {"1m": 8, "1h": 2, "30s": 4}, depths)
    assert [(r.tier, r.indexed, r.queued, r.unheld) for r in rows] == [
        ("1m", 8, 5, 3),
        ("1h", 2, None, 0),
        ("30s", 4, None, 0),
    ]
    text = beside_table(rows).plain()
    assert "tier 1m: the index shows 3 more waiting than its queues hold" in text
    assert "tier 30s: 4 waiting in the index, but the topology has no such tier" in text
    assert beside_json(rows)["disagrees"] is True


def test_a_tier_holding_more_than_the_index_agrees() -> None:
    depths = {
        name: Depth(ready=9, unacked=0, consumers=0) for name in ("shop.tier.1m", "shop.tier.1h")
    }
    rows = beside(TOPOLOGY, {"1m": 9}, depths)
    assert [(r.indexed, r.queued) for r in rows] == [(9, 9), (0, 9)]
    assert beside_json(rows)["disagrees"] is False
    assert beside_table(rows).after == []


def test_replayed_entries_wait_in_no_tier_and_disagree_with_nothing() -> None:
    """A DLQ replay's copies (tier "") are at their queues, not in a lost tier."""
    depths = {
        name: Depth(ready=1, unacked=0, consumers=0) for name in ("shop.tier.1m", "shop.tier.1h")
    }
    rows = beside(TOPOLOGY, {"1m": 1, "": 7}, depths)
    assert [(r.tier, r.indexed) for r in rows][-1] == ("", 7)
    text = beside_table(rows).plain()
    assert "(none: replayed)" in text and "at their destinations" in text
    assert "no such tier" not in text
    assert beside_json(rows)["disagrees"] is False
