"""How long a publisher's link keeps trying to reach the broker.

Two situations, two rules (the Java client's automatic recovery draws the same line):

* **A first connection** that fails is most often a wrong URL or a broker not started:
  after ``connect_attempts`` rounds over the URL's hosts (about a second with the
  default back-off) it fails with :class:`~delayq.errors.ConnectionFailed`, so a
  mistake is reported at once.
* **A link that has been up** and loses its broker is most often a restart, an upgrade
  or a failover to another node: it keeps trying for ``reconnect_within`` (30 s by
  default), pausing at most :data:`MAX_PAUSE_S` between rounds, so a broker back
  within the budget costs a batch nothing but its in-flight window sent again.

When the budget is spent, what is left fails and says which it is: a message written
and not confirmed is :class:`~delayq.errors.PublishUnconfirmed` (it may be at the
broker), one never written is :class:`~delayq.errors.PublishNotSent` (it is not). A
batch gives up only once nothing has been confirmed for the whole budget.

:class:`Reconnecting` is a link's memory of having been up; :class:`Tries` yields the
connection attempts one rule allows, each a ``(pause_s, single-host URL)``:

>>> import random
>>> tries = Tries("amqp://h1,h2/", attempts=2, backoff_s=0.5, rng=random.Random(0))
>>> list(tries)
[(0.0, 'amqp://h2/'), (0.0, 'amqp://h1/'), (0.5, 'amqp://h2/'), (0.0, 'amqp://h1/')]
>>> tries.spent()
'after 2 attempts'
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator

from delayq.durations import to_ms
from delayq.urls import hosts_in_turn

__all__ = [
    "CONNECT_BACKOFF_S",
    "DEFAULT_RECONNECT_WITHIN_S", "MAX_PAUSE_S", "Reconnecting", "Tries", "pause_s"]

DEFAULT_RECONNECT_WITHIN_S = 30.0
"""How long a link that has been up keeps trying to reach its broker again."""

CONNECT_BACKOFF_S = 0.25
"""The first pause between two rounds of connection attempts (doubled each round)."""

MAX_PAUSE_S = 2.0
"""The longest pause between two rounds of attempts: a broker back is found within it."""


def pause_s(round_: int, backoff_s: float) -> float:
    """The pause before round ``round_`` (0 is the first): ``backoff_s``, doubling, capped.

    >>> [pause_s(n, 0.25) for n in range(6)]
    [0.0, 0.25, 0.5, 1.0, 2.0, 2.0]
    """
    if round_ <= 0:
        return 0.0
    # The exponent bounded: 2.0**1024 raises OverflowError, a round a long outage reaches
    # (reconnect_within of hours, a pause of MAX_PAUSE_S per round); 2**64 is past any cap.
    return min(MAX_PAUSE_S, backoff_s * 2.0 ** min(round_ - 1, 64))


class Tries:
    """The connection attempts of one rule: ``attempts`` rounds, or, given ``within_s``,
    rounds for as long as ``within_s`` seconds after the first (the last one's pause is
    shortened so that it begins when the budget ends; none begins after). Each round
    tries every host of ``url`` once, from a random start
    (:func:`delayq.urls.hosts_in_turn`), the same order every round."""

    def __init__(
        self,
        url: str,
        *,
        attempts: int,
        backoff_s: float,
        within_s: float | None = None,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self.attempts = max(1, attempts)
        self.backoff_s = backoff_s
        self.within_s = within_s
        self.made = 0
        """Rounds begun so far."""
        self._rng = rng
        self._clock = clock

    def __iter__(self) -> Iterator[tuple[float, str]]:
        urls = hosts_in_turn(self.url, self._rng)
        deadline = None if self.within_s is None else self._clock() + self.within_s
        while True:
            pause = pause_s(self.made, self.backoff_s)
            if deadline is None:
                if self.made >= self.attempts:
                    return
            elif self.made:
                left = deadline - self._clock()
                if left <= 0:
                    return
                # The last round begins when the budget ends, not a pause short of it:
                # a broker back in the budget's last seconds is still found.
                pause = min(pause, left)
            self.made += 1
            for i, one in enumerate(urls):
                yield (pause if i == 0 else 0.0), one

    def spent(self) -> str:
        """How the attempts ended, for an error: ``after 3 attempts`` or
        ``for 30 s (17 attempts)``."""
        if self.within_s is None:
            return f"after {self.made} attempts"
        return f"for {self.within_s:g} s ({self.made} attempts)"


class Reconnecting:
    """A link's rule for reaching its broker: ``connect_attempts`` rounds until it has
    been up once, then ``within_s`` seconds of rounds (``None``: the rounds only)."""

    def __init__(self, attempts: int, backoff_s: float, within_s: float | None) -> None:
        self.attempts = max(1, attempts)
        self.backoff_s = backoff_s
        self.within_s = within_s
        self.up = False
        """Whether a connection of this link has been open (set by the link)."""

    def tries(self, url: str, rng: random.Random | None = None) -> Tries:
        """The attempts the link may make now."""
        return Tries(
            url,
            attempts=self.attempts,
            backoff_s=self.backoff_s,
            within_s=self.within_s if self.up else None,
            rng=rng,
        )

    def gives_up(self, barren_rounds: int, limit: int, quiet_since: float) -> bool:
        """Whether a batch stops after ``barren_rounds`` rounds in a row that confirmed
        nothing: once up, when nothing was confirmed for ``within_s`` seconds since
        ``quiet_since`` (a ``time.monotonic()``); before, after ``limit`` rounds."""
        if self.up and self.within_s is not None:
            return time.monotonic() - quiet_since > self.within_s
        return barren_rounds >= limit

    def spent(self, rounds: int) -> str:
        """How a batch's attempts ended, for an error (see :meth:`Tries.spent`)."""
        if self.up and self.within_s is not None:
            return f"for {self.within_s:g} s ({rounds} attempts)"
        return f"after {rounds} attempts"


def within_seconds(value: object) -> float | None:
    """A publisher's ``reconnect_within`` (a duration, or ``None``) in seconds.

    >>> within_seconds("30s"), within_seconds(None)
    (30.0, None)
    """
    if value is None:
        return None
    return to_ms(value, what="reconnect_within") / 1000
