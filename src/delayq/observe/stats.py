"""What a consumer did: counters both consumers keep the same way, and the log line of each fate."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from delayq.consume.delivery import Action, Decision

__all__ = ["ConsumerStats"]

log = logging.getLogger("delayq.consumer")


@dataclass
class ConsumerStats:
    """Counts of deliveries by fate since the consumer started."""

    handled: int = 0
    duplicates: int = 0
    cancelled: int = 0
    """Deliveries skipped because their message was cancelled (or rescheduled)."""
    retried: int = 0
    dead_lettered: int = 0
    returned: int = 0
    """Deliveries put back on the queue: their republish was not confirmed, or the
    idempotency store failed."""
    reconnects: int = 0
    """Times the consumer reopened a lost connection or channel."""
    stuck_handlers: int = 0
    """Handler threads (of a sync ``Consumer``) still running a handler that overran
    ``handler_timeout``, now."""
    stuck_since: float | None = None
    """``time.monotonic()`` since when every handler thread the consumer may have is
    stuck (no handler can start), or ``None``."""

    def record(self, decision: Decision) -> None:
        """Count a delivery whose fate is settled (acked), and log retries and dead letters."""
        message_id = decision.message.message_id if decision.message is not None else ""
        if decision.action is Action.ACK:
            self.handled += 1
        elif decision.action is Action.DUPLICATE:
            self.duplicates += 1
        elif decision.action is Action.CANCELLED:
            self.cancelled += 1
        elif decision.action is Action.RETRY:
            self.retried += 1
            log.info("retrying %s (%s)", message_id, decision.reason)
        else:
            self.dead_lettered += 1
            log.warning("dead-lettered %s: %s", message_id, decision.reason)
