"""RabbitMQ's topic matching: ``*`` is exactly one word, ``#`` zero or more.

Pure: publishers use it to refuse a routing key no binding of the topology
matches (see :class:`BindingKeys`), and the memory broker to route.

>>> topic_matches("job.*", "job.email")
True
>>> topic_matches("job.#", "job")
True
>>> topic_matches("*.email", "email")
False
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache

__all__ = ["BindingKeys", "topic_matches"]


def topic_matches(binding_key: str, routing_key: str) -> bool:
    """Whether a topic exchange's ``binding_key`` matches ``routing_key``.

    Words are separated by dots; an empty key has no words, so only ``""`` and
    ``"#"`` match it (as in RabbitMQ's trie).
    """
    return _match(_words(binding_key), _words(routing_key))


def _words(key: str) -> tuple[str, ...]:
    return tuple(key.split(".")) if key else ()


@lru_cache(maxsize=4096)
def _match(pattern: tuple[str, ...], words: tuple[str, ...]) -> bool:
    if not pattern:
        return not words
    head, rest = pattern[0], pattern[1:]
    if head == "#":
        # Zero words, or one word and '#' still in force.
        return _match(rest, words) or (bool(words) and _match(pattern, words[1:]))
    if not words:
        return False
    return (head == "*" or head == words[0]) and _match(rest, words[1:])


class BindingKeys:
    """A set of binding keys of one topic exchange, asked which routing keys they take.

    >>> keys = BindingKeys(["email.*", "orders.#"])
    >>> keys.match("email.welcome"), keys.match("emial.welcome")
    ('email.*', None)
    """

    _CACHE_MAX = 4096
    """Routing keys remembered; a publisher sends few distinct keys, but a caller that
    builds one per message must not grow the cache without bound."""

    def __init__(self, binding_keys: Iterable[str]) -> None:
        self.keys = tuple(dict.fromkeys(binding_keys))
        self._catch_all = "#" in self.keys
        self._seen: dict[str, str | None] = {}

    def match(self, routing_key: str) -> str | None:
        """The first binding key that matches ``routing_key``, else ``None``."""
        if self._catch_all:
            return "#"
        try:
            return self._seen[routing_key]
        except KeyError:
            pass
        found = next((k for k in self.keys if topic_matches(k, routing_key)), None)
        if len(self._seen) >= self._CACHE_MAX:
            self._seen.clear()
        self._seen[routing_key] = found
        return found
