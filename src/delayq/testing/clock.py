"""The memory broker's virtual clock: time moves only when a test moves it."""

from __future__ import annotations

from datetime import datetime, timezone

from delayq.errors import InvalidInput

__all__ = ["DEFAULT_START_MS", "VirtualClock"]

DEFAULT_START_MS = 1_767_225_600_000
"""2026-01-01T00:00:00Z: a fixed start, so runs are reproducible."""


class VirtualClock:
    """Epoch milliseconds that only move forward, and only when told.

    Pass ``clock.now_ms`` wherever delayq takes ``clock_ms=``.
    """

    def __init__(self, start_ms: int = DEFAULT_START_MS) -> None:
        self._now_ms = start_ms

    def now_ms(self) -> int:
        """The virtual time, in epoch milliseconds."""
        return self._now_ms

    @property
    def now(self) -> datetime:
        """The virtual time as an aware UTC datetime."""
        return datetime.fromtimestamp(self._now_ms / 1000, tz=timezone.utc)

    def move_to(self, at_ms: int) -> None:
        """Set the time to ``at_ms``; it never goes back."""
        if at_ms < self._now_ms:
            raise InvalidInput(f"the virtual clock cannot go back ({at_ms} < {self._now_ms})")
        self._now_ms = at_ms
