"""RabbitMQ's topic matching: ``*`` is exactly one word, ``#`` zero or more.

>>> topic_matches("job.*", "job.email")
True
>>> topic_matches("job.#", "job")
True
>>> topic_matches("*.email", "email")
False
"""

from __future__ import annotations

from functools import lru_cache

__all__ = ["topic_matches"]


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
