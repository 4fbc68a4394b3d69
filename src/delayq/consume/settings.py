"""A consumer's settings, validated once for both adapters, and its reconnect and stall timings."""

from __future__ import annotations

from dataclasses import dataclass

from delayq.durations import to_ms
from delayq.errors import InvalidInput

__all__ = [
    "MAX_PREFETCH",
    "RECONNECT_MAX_S",
    "RECONNECT_MIN_S",
    "STALL_CHECK_S",
    "ConsumeSettings",
    "check_concurrency",
    "check_prefetch",
]


RECONNECT_MIN_S = 0.5


RECONNECT_MAX_S = 10.0
"""A consumer's back-off between attempts to reopen a lost connection (doubling, capped)."""


MAX_PREFETCH = 65_535
"""The largest prefetch count: AMQP's basic.qos carries it in 16 bits (pika's
``struct.pack('H')`` failed past it, after connecting)."""

STALL_CHECK_S = 10.0
"""A consumer idle this long while its queue holds ready messages re-subscribes."""


@dataclass(frozen=True, slots=True)
class ConsumeSettings:
    """A consumer's validated knobs, the same for both adapters."""

    prefetch: int
    handler_timeout_ms: int
    lease_ms: int
    """How long a claim holds a key: past the handler's timeout, so only a crash lets
    it lapse before the handler is done."""
    retention_ms: int = 7 * 86_400_000
    """How long a completed key is remembered (duplicates later than this run again)."""
    prune_every_ms: int = 600_000
    concurrency: int | None = None
    """Handlers running at once (``None``: the adapter's default); at most ``prefetch``."""
    stuck_grace_ms: int | None = 60_000
    """How long a sync consumer whose every handler thread is stuck past its timeout
    waits for one to return before it stops and raises
    :class:`~delayq.errors.HandlersStuck` (``None``: it waits for ever)."""

    @classmethod
    def parse(
        cls,
        *,
        prefetch: int,
        handler_timeout: object,
        lease: object = None,
        retention: object = "7d",
        concurrency: object = None,
        stuck_grace: object = "1m",
    ) -> ConsumeSettings:
        check_prefetch(prefetch)
        checked = check_concurrency(concurrency, prefetch)
        timeout_ms = to_ms(handler_timeout, what="handler_timeout")
        if timeout_ms <= 0:
            raise InvalidInput("handler_timeout must be longer than 0")
        lease_ms = timeout_ms + 60_000 if lease is None else to_ms(lease, what="lease")
        if lease_ms <= timeout_ms:
            raise InvalidInput("lease must be longer than handler_timeout")
        retention_ms = to_ms(retention, what="retention")
        if retention_ms < lease_ms:
            raise InvalidInput("retention must be at least as long as the claim's lease")
        prune_every_ms = max(1_000, min(600_000, retention_ms // 10))
        grace_ms = None if stuck_grace is None else to_ms(stuck_grace, what="stuck_grace")
        return cls(prefetch, timeout_ms, lease_ms, retention_ms, prune_every_ms, checked, grace_ms)


def check_prefetch(prefetch: object) -> int:
    """``prefetch`` if it is an int from 1 to :data:`MAX_PREFETCH`, else
    :class:`~delayq.errors.InvalidInput` saying why."""
    if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1:
        raise InvalidInput(f"prefetch must be an int of at least 1, got {prefetch!r}")
    if prefetch > MAX_PREFETCH:
        raise InvalidInput(
            f"prefetch {prefetch} is more than {MAX_PREFETCH}, the most AMQP's prefetch "
            "count (16 bits) can say"
        )
    return prefetch


def check_concurrency(concurrency: object, prefetch: int) -> int | None:
    """``concurrency`` if it is ``None`` or an int from 1 to ``prefetch``, else
    :class:`~delayq.errors.InvalidInput` saying what to change."""
    if concurrency is None:
        return None
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise InvalidInput(
            f"concurrency must be an int of at least 1 (handlers running at once), "
            f"got {concurrency!r}"
        )
    if concurrency > prefetch:
        # Only prefetched deliveries can run: more would be a promise not kept.
        raise InvalidInput(
            f"concurrency {concurrency} is more than prefetch {prefetch}: a consumer runs "
            "at most as many handlers as it has deliveries; raise prefetch or lower concurrency"
        )
    return concurrency
