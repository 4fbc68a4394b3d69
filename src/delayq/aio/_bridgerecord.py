"""The bridge's writes into a schedule index (``Bridge(..., schedule=)``, ``delayq bridge
--schedule-index``), as a publisher's (:mod:`delayq.schedule.record`): a forward's entry
is written *pending* before it is published and moved once the broker settled it;
only then is its delivery acked from the intake queue.

So a message acked from the intake is *scheduled* in the index (unless the move itself
failed: it stays *pending*, logged, and the consumers' reports move it on). A bridge
killed between the confirm and the move leaves the delivery unacked: the next bridge
forwards it again under its id, and its entry is recorded again. A pending write that
fails publishes nothing: the delivery goes back to the intake queue, and the bridge
pauses as after a refused publish (:data:`~delayq.aio._relaying.REFUSED_PAUSE_S`).

The writes run in batches (what arrived while the last write ran), in a thread when the
store blocks (SQLite, PostgreSQL, Redis): the bridge's event loop never waits on them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from delayq.errors import DelayqError
from delayq.message.envelope import OutgoingMessage, epoch_ms
from delayq.schedule.record import ScheduleIndex
from delayq.topology.model import Topology

__all__ = ["BridgeRecord"]

log = logging.getLogger("delayq.bridge")


class BridgeRecord:
    """One bridge's index writes: pending before a batch is published, moved after."""

    def __init__(
        self, index: ScheduleIndex, topology: Topology, clock_ms: Callable[[], int] = epoch_ms
    ) -> None:
        self.index = index
        self.topology = topology
        self._clock_ms = clock_ms
        self._blocking = bool(getattr(index.store, "blocking", True))

    async def _call(self, step: Callable[..., object], *args: object) -> object:
        return await asyncio.to_thread(step, *args) if self._blocking else step(*args)

    async def before(self, messages: Sequence[OutgoingMessage]) -> list[str]:
        """Write ``messages`` pending; the ids recorded (one already waiting under its id,
        a redelivery's, keeps its entry). Raises
        :class:`~delayq.errors.ScheduleNotRecorded` when the store cannot take them."""
        ids = await self._call(self.index.before, self.topology, messages)
        assert isinstance(ids, list)
        return ids

    async def after(self, ids: Sequence[str], confirmed: set[str]) -> None:
        """Move ``ids``: scheduled where confirmed, unconfirmed where not. A store that
        cannot take it is logged (the entries stay pending), never raised: the messages
        are at the broker, and their deliveries are acked all the same."""
        try:
            await self._call(self.index.settled, ids, (), confirmed, None, self._clock_ms())
        except DelayqError as exc:
            log.error(
                "the schedule index kept %d entries pending (their messages are in their "
                "tiers): %s",
                len(ids),
                exc,
            )
