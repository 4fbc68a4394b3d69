"""send_resilient: a partition's stream through outages, on a scripted sender (no broker);
publish_partition's accounting with nothing listening.

The broker-backed behaviour (a node stopped mid-job) is in test_outage.py; these pin
the bookkeeping: what is sent again, counted as retried, handed back unconfirmed.
"""

from __future__ import annotations

import itertools
import socket
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from delayq import (
    AccessRefused,
    ConnectionFailed,
    InvalidDelay,
    InvalidInput,
    PublishUnconfirmed,
    Topology,
)
from delayq.spark._plan_task import REJECTED
from delayq.spark._resilient import RetryPolicy, send_resilient
from delayq.spark._schedule_task import FAILED, UNCONFIRMED, publish_partition


class Script:
    """A sender whose every send_many call does the next step of a script:
    ``("ok",)`` confirms all; ``("drop", n)`` confirms n, hands over a window more and
    loses them (as send_pipelined does once its attempts are spent); ``("down",)``
    cannot connect; ``("refused",)`` is refused for good."""

    def __init__(self, *steps: tuple[Any, ...]) -> None:
        self.steps = list(steps)
        self.calls = 0
        self.sent: list[Any] = []  # every message handed over, re-sends included

    def send_many(
        self, messages: Iterable[Any], *, settle: Callable[..., None], window: int = 1000
    ) -> None:
        step = self.steps[min(self.calls, len(self.steps) - 1)]
        self.calls += 1
        if step[0] == "down":
            raise ConnectionFailed("cannot connect to the broker at amqp://x after 1 attempts")
        if step[0] == "refused":
            raise AccessRefused("access refused")
        it = enumerate(messages)
        if step[0] == "ok":
            for index, msg in it:
                self.sent.append(msg)
                settle(index, msg, None)
            return
        for _ in range(step[1]):
            found = next(it, None)
            if found is None:
                return
            self.sent.append(found[1])
            settle(found[0], found[1], None)
        lost = [item for _, item in zip(range(window), it, strict=False)]
        self.sent.extend(msg for _, msg in lost)
        # The drain: what was in flight, then what is left of the stream, one at a time.
        for index, msg in itertools.chain(lost, it):
            settle(index, msg, PublishUnconfirmed(f"message {msg!r} was not confirmed"))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.pauses: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds


def run(sender: Script, n: int, policy: RetryPolicy, **kwargs: Any) -> tuple[Any, dict[str, int]]:
    settled: dict[str, int] = {}

    def settle(tag: str, msg: Any, error: Any) -> None:
        assert error is None
        settled[tag] = settled.get(tag, 0) + 1

    clock = Clock()
    stream = ((f"k{i}", f"m{i}") for i in range(n))
    outcome = send_resilient(
        sender, stream, settle, window=10, policy=policy, clock=clock, sleep=clock.sleep, **kwargs
    )
    return outcome, settled


def test_a_dropped_connection_sends_only_what_was_unconfirmed_again_and_counts_it() -> None:
    sender = Script(("drop", 25), ("down",), ("down",), ("ok",))
    outcome, settled = run(sender, 100, RetryPolicy.parse("60s", "100ms"))
    assert outcome.stalled is None
    assert settled == {f"k{i}": 1 for i in range(100)}  # each settled once, confirmed
    assert outcome.retried == 10  # the window in flight at the drop, not the 65 never sent
    assert len(sender.sent) == 110
    assert sender.calls == 4


def test_a_broker_gone_longer_than_the_budget_hands_back_what_was_in_flight() -> None:
    sender = Script(("drop", 5), ("down",))
    outcome, settled = run(sender, 50, RetryPolicy.parse("2s", "200ms"))
    assert outcome.stalled is not None and not outcome.stalled.fatal
    assert isinstance(outcome.stalled.cause, ConnectionFailed)
    assert len(settled) == 5
    # The window lost at the drop comes back, in order; the stream's rest is left unread.
    assert [tag for tag, _ in outcome.stalled.left] == [f"k{i}" for i in range(5, 15)]
    assert outcome.retried == 0


def test_pauses_double_up_to_the_budget() -> None:
    clock = Clock()
    sender = Script(("down",))
    outcome = send_resilient(
        sender,
        iter([("k0", "m0")]),
        lambda *a: None,
        window=10,
        policy=RetryPolicy.parse("2s", "200ms"),
        clock=clock,
        sleep=clock.sleep,
    )
    assert outcome.stalled is not None
    assert clock.pauses == pytest.approx([0.2, 0.4, 0.8, 0.6])  # the last one: what was left
    assert clock.now == pytest.approx(2.0)


def test_several_short_outages_each_within_the_budget_are_survived() -> None:
    steps = [("drop", 10), ("down",), ("down",)] * 5 + [("ok",)]
    sender = Script(*steps)
    outcome, settled = run(sender, 200, RetryPolicy.parse("1s", "300ms"))
    assert outcome.stalled is None
    assert len(settled) == 200 and set(settled.values()) == {1}
    assert outcome.retried == 50


def test_a_refusal_is_not_waited_out_and_a_gone_broker_is_given_up_at_once_when_asked() -> None:
    outcome, _ = run(Script(("drop", 3), ("refused",)), 20, RetryPolicy.parse("60s", "1s"))
    assert outcome.stalled is not None and outcome.stalled.fatal
    assert isinstance(outcome.stalled.cause, AccessRefused)
    sender = Script(("down",))
    outcome, _ = run(sender, 20, RetryPolicy.parse("60s", "1s"), give_up_at_once=True)
    assert outcome.stalled is not None and sender.calls == 1


def test_retry_settings_are_durations() -> None:
    assert RetryPolicy.parse("0s", "1ms") == RetryPolicy(0, 1)
    with pytest.raises(InvalidDelay, match="retry_for"):
        RetryPolicy.parse("60", "1s")  # a bare number has no unit
    with pytest.raises(InvalidInput, match="backoff"):
        RetryPolicy.parse("1m", "0s")


def test_a_partition_with_no_broker_accounts_for_every_row_with_its_id() -> None:
    """publish_partition over task rows ``(key, routing_key, delay, due_us, due_text, body,
    id)``, nothing listening on the port and no retry: each valid row comes out unconfirmed
    and each bad one rejected, both with the row's id, then one ``failed`` line."""
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    topology = Topology(
        namespace="resil", ladder=["1s"], destinations=[{"queue": "resil.w", "bindings": ["job.#"]}]
    )
    task = publish_partition(
        f"amqp://guest:guest@127.0.0.1:{port}/",
        topology.model_dump(mode="json"),
        window=10,
        body_json=False,
        policy=RetryPolicy.parse("0s", "1ms"),
        job="no-broker",
    )
    rows = [("k1", "job.a", "1s", None, None, "a", "ref-1"),
            ("k2", "job.a", "soon", None, None, "b", "ref-2"),
            ("k3", "job.a", "0s", None, None, "c", "ref-3")]  # fmt: skip
    out = list(task(rows))
    assert all(len(t) == 9 for t in out)
    said = {(kind, key): (tier, error, id_) for kind, key, _, _, tier, error, _, _, id_ in out}
    assert said == {
        (UNCONFIRMED, "k1"): ("1s", "PublishUnconfirmed", "ref-1"),
        (UNCONFIRMED, "k3"): ("immediate", "PublishUnconfirmed", "ref-3"),
        (REJECTED, "k2"): ("-", "InvalidDelay", "ref-2"),
        (FAILED, None): (None, "ConnectionFailed", None),
    }
    reasons = {t[1]: t[6] for t in out if t[0] == UNCONFIRMED}
    assert all(r.startswith("unconfirmed: the broker confirmed nothing") for r in reasons.values())
