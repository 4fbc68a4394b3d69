"""The bridge's stream bookkeeping (no broker): each delivery acked only once its own
confirm and every one before it are in, confirmed runs coalesced into one ``multiple``
ack, a refused one nacked alone."""

from __future__ import annotations

from typing import Any

from delayq import Topology
from delayq.errors import PublishRejected
from delayq.intake import Incoming, Relay
from delayq.intake.window import Settled, Window, coalesce

TOPO = Topology(
    namespace="shop",
    ladder=["1s"],
    destinations=[{"queue": "emails", "bindings": ["email.welcome"]}],
    intakes=[{"exchange": "delayed", "type": "direct"}],
)
RELAY = Relay(TOPO, TOPO.intakes[0])


def _plan(n: int) -> Any:
    return RELAY.plan(Incoming("email.welcome", b"{}", {"message_id": f"m-{n}",
                                                         "headers": {"x-delay": 500}}))  # fmt: skip


REFUSED = PublishRejected("nacked")


def test_a_confirm_waits_for_every_delivery_before_it() -> None:
    window = Window()
    for tag in (1, 2, 3, 5):  # 4 was rejected on arrival: never in the window
        window.add(tag, _plan(tag))
    window.settled(2, None)
    window.settled(3, None)
    assert window.ready() == []  # 1 is still in flight
    window.settled(1, None)
    assert [s.tag for s in window.ready()] == [1, 2, 3]
    assert len(window) == 1
    window.settled(5, REFUSED)
    window.settled(5, None)  # a second outcome is ignored
    [last] = window.ready()
    assert (last.tag, last.error) == (5, REFUSED)
    assert len(window) == 0


def test_confirmed_runs_are_one_multiple_ack_and_a_refused_delivery_is_nacked_alone() -> None:
    p = _plan(0)
    done = [Settled(1, p, None), Settled(2, p, None), Settled(3, p, REFUSED),
            Settled(4, p, REFUSED), Settled(6, p, None)]  # fmt: skip
    assert coalesce(done) == [("ack", 2), ("nack", 3), ("nack", 4), ("ack", 6)]
    assert coalesce([Settled(7, p, None)]) == [("ack", 7)]
    assert coalesce([]) == []


def test_a_discarded_delivery_no_longer_holds_back_those_after_it() -> None:
    window = Window()
    window.add(1, _plan(1))
    window.add(2, _plan(2))
    window.settled(2, None)
    window.discard(1)
    assert [s.tag for s in window.ready()] == [2]
