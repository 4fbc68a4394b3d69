"""Counted nouns for messages to people: "1 message", "2 messages"."""

from __future__ import annotations

__all__ = ["counted"]


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """``count`` and ``noun``, plural unless ``count`` is 1 (``plural`` for irregular ones).

    >>> counted(1, "retry", "retries"), counted(3, "message")
    ('1 retry', '3 messages')
    """
    return f"{count} {noun if count == 1 else plural or noun + 's'}"
