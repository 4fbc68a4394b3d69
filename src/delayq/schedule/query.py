"""Which entries of the schedule index a command or a call means: a filter every store
answers alike (the memory store with :meth:`Query.matches`, SQL stores in their own
language and this for what they cannot say), and the order pages come in.

>>> from delayq.schedule.entry import Entry, State
>>> e = Entry("m1", "shop", "orders.reminder", due_at_ms=5_000, tier="30s",
...           published_at_ms=0, size=10, state=State.SCHEDULED)
>>> Query(routing_key="orders.#", due_before_ms=10_000).matches(e)
True
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from types import MappingProxyType

from delayq.errors import InvalidInput
from delayq.schedule.entry import MAX_MS, WAITING, Entry, State
from delayq.topology.topic import topic_matches

__all__ = ["Cursor", "Query", "page_key", "topic_regex"]

Cursor = tuple[int, str]
"""Where a page ends: the last entry's ``(due_at_ms, id)``; the next page starts after it."""


def topic_regex(pattern: str) -> str:
    """A regular expression (POSIX and Python alike) that matches ``"." + routing_key``
    (``""`` for the empty key: it has no words) exactly when the topic ``pattern``
    matches ``routing_key``: ``*`` one word, ``#`` zero or more, words split on dots.

    >>> import re
    >>> bool(re.fullmatch(topic_regex("a.#"), ".a")), bool(re.fullmatch(topic_regex("*"), ""))
    (True, False)
    """
    parts = []
    for word in pattern.split(".") if pattern else []:
        if word == "#":
            parts.append(r"(\.[^.]*)*")
        elif word == "*":
            parts.append(r"\.[^.]*")
        else:
            parts.append(r"\." + "".join(c if c.isalnum() or c == "_" else "\\" + c for c in word))
    return "^" + "".join(parts) + "$"


def page_key(entry: Entry) -> Cursor:
    """The order of pages: due time, then id (unique, so no entry is shown twice)."""
    return (entry.due_at_ms, entry.id)


def _states(value: Iterable[State | str]) -> frozenset[State]:
    if isinstance(value, (str, State)):
        value = [value]
    states = set()
    for each in value:
        try:
            states.add(State(each))
        except ValueError:
            names = ", ".join(s.value for s in State)
            raise InvalidInput(f"no state {each!r}: the states are {names}") from None
    if not states:
        raise InvalidInput("a query names at least one state")
    return frozenset(states)


def _optional_ms(name: str, value: object) -> int | None:
    """``value`` as a bound of due times, held within what a store keeps (no entry is
    due outside it, so the answer is the same)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"{name} is epoch milliseconds (an int), not {value!r}")
    return max(-MAX_MS, min(value, MAX_MS))


@dataclass(frozen=True)
class Query:
    """Entries of ``namespace`` in one of ``states``, whose routing key a topic pattern
    matches, routed to ``destination``, due in ``[due_after_ms, due_before_ms)``, with
    every label of ``labels`` and the ``business_key``. ``None``: any."""

    namespace: str | None = None
    states: AbstractSet[State] = WAITING
    routing_key: str | None = None
    destination: str | None = None
    due_after_ms: int | None = None
    due_before_ms: int | None = None
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    business_key: str | None = None
    ids: AbstractSet[str] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "states", _states(self.states))
        for name in ("due_after_ms", "due_before_ms"):
            object.__setattr__(self, name, _optional_ms(name, getattr(self, name)))
        for name in ("namespace", "routing_key", "destination", "business_key"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise InvalidInput(f"{name} is a str, not {value!r}")
        if not isinstance(self.labels, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.labels.items()
        ):
            raise InvalidInput(f"labels are a mapping of str to str, not {self.labels!r}")
        object.__setattr__(self, "labels", MappingProxyType(dict(self.labels)))
        if self.ids is not None:
            object.__setattr__(self, "ids", frozenset(self.ids))

    def matches(self, entry: Entry) -> bool:
        return (
            entry.state in self.states
            and (self.namespace is None or entry.namespace == self.namespace)
            and (self.ids is None or entry.id in self.ids)
            and (self.due_after_ms is None or entry.due_at_ms >= self.due_after_ms)
            and (self.due_before_ms is None or entry.due_at_ms < self.due_before_ms)
            and (self.business_key is None or entry.business_key == self.business_key)
            and (self.destination is None or self.destination in entry.destinations)
            and all(entry.labels.get(k) == v for k, v in self.labels.items())
            and (self.routing_key is None or topic_matches(self.routing_key, entry.routing_key))
        )
