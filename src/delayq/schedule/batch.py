"""A batch recorded in the schedule index beside its sends: the asyncio publisher's
``publish_many`` with an index in a store that blocks (a file, a server) writes a step's
entries pending in a thread while the step before is sent, and moves them while the step
after is sent, so the index costs the batch little more than its CPU (issue 51: with
SQLite, 0.58 of the rate without an index when written before and after the whole batch).
Every message is still recorded before it is sent and moved before the publish returns.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from delayq.errors import (
    DelayqError,
    PublishBatchError,
    PublishError,
    PublishNotSent,
    PublishUnconfirmed,
    ScheduleNotRecorded,
)
from delayq.message.envelope import OutgoingMessage
from delayq.schedule.record import ScheduleIndex
from delayq.topology.model import Topology

__all__ = ["CHUNK", "arecord_batch"]

log = logging.getLogger("delayq.schedule")

CHUNK = 5000
"""Messages of a batch :func:`arecord_batch` records and sends a step at a time."""


async def arecord_batch(
    index: ScheduleIndex,
    topology: Topology,
    messages: Sequence[OutgoingMessage],
    now_ms: Callable[[], int],
    send: Callable[[Sequence[OutgoingMessage]], Awaitable[None]],
    *,
    chunk: int = CHUNK,
) -> None:
    """:func:`arecording` around ``send`` of a batch, ``chunk`` messages a step, the index's
    writes beside the sends: a step's entries are written pending while the step before
    is sent, and moved while the step after is sent. Every message is still recorded
    before it is sent and moved once its confirm (or failure) is known, before this
    returns.

    Raises as one send of the whole batch would: ``ScheduleNotRecorded`` if the first
    step could not be recorded (nothing was sent); ``PublishBatchError`` naming every
    message not confirmed, those of a later step the index could not record among them
    (:class:`~delayq.errors.PublishNotSent`: never sent); then ``ScheduleNotRecorded``
    with the receipts if a confirm's write failed. ``send`` raises ``PublishBatchError``
    for what it did not confirm of its step."""
    blocking = getattr(index.store, "blocking", True)

    async def call(step: Callable[..., Any], *args: object) -> Any:
        return await asyncio.to_thread(step, *args) if blocking else step(*args)

    if not blocking:  # written in the loop's own turn: nothing to do beside the sends
        chunk = max(chunk, len(messages))
    steps = [messages[i : i + chunk] for i in range(0, len(messages), chunk)]
    failures: dict[int, PublishError] = {}
    moves: list[asyncio.Future[Any]] = []
    try:
        ids: list[str] = await call(index.before, topology, steps[0])
    except ScheduleNotRecorded as exc:
        if len(steps) == 1:
            raise
        raise ScheduleNotRecorded(
            f"the schedule index could not record the first {len(steps[0])} of a batch of "
            f"{len(messages)} message(s); nothing was published: {exc.__cause__ or exc}"
        ) from exc
    offset = 0
    for number, step in enumerate(steps):
        ahead = steps[number + 1] if number + 1 < len(steps) else None
        recording = None if ahead is None else asyncio.ensure_future(
            call(index.before, topology, ahead)
        )  # fmt: skip
        try:
            await send(step)
            error: BaseException | None = None
        except PublishBatchError as exc:
            error = exc
            failures.update({offset + i: e for i, e in exc.failures.items()})
        except BaseException as exc:
            if recording is not None and ahead is not None:  # recorded, never sent
                try:
                    unsent: list[str] = await recording
                except DelayqError:
                    unsent = []
                await call(index.after, unsent, ahead, exc, now_ms())
            await call(index.after, ids, step, exc, now_ms())
            await asyncio.gather(*moves, return_exceptions=True)
            if number == 0 or not isinstance(exc, DelayqError):
                raise
            error = exc
            failures.update(
                {offset + i: PublishUnconfirmed(str(exc), m.message_id) for i, m in enumerate(step)}
            )
            _not_sent(failures, messages, offset + len(step), exc)
            break
        moves.append(asyncio.ensure_future(call(index.after, ids, step, error, now_ms())))
        offset += len(step)
        if recording is not None:
            try:
                ids = await recording
            except ScheduleNotRecorded as exc:
                _not_sent(failures, messages, offset, exc)
                break
    moved = await asyncio.gather(*moves, return_exceptions=True)
    errors = [o for o in moved if isinstance(o, BaseException)]
    if failures:
        receipts = [None if i in failures else m.receipt for i, m in enumerate(messages)]
        failed = PublishBatchError(receipts, failures)
        pending = sum(len(e.receipts) for e in errors if isinstance(e, ScheduleNotRecorded))
        if pending:  # confirmed, but their entries still show them pending: say so too
            note = (
                f"also: {pending} message(s) confirmed (their receipts are here) still show "
                f"pending in the schedule index, which could not record the confirms: "
                f"{errors[0].__cause__ or errors[0]}; do not publish them again"
            )
            log.error("%s", note)
            add_note = getattr(failed, "add_note", None)  # Python 3.11 and later
            if add_note is not None:
                add_note(note)
        raise failed
    if errors and isinstance(errors[0], ScheduleNotRecorded):
        pending = sum(len(e.receipts) for e in errors if isinstance(e, ScheduleNotRecorded))
        raise ScheduleNotRecorded(
            f"all {len(messages)} message(s) were published and confirmed, but the schedule "
            f"index still shows {pending} of them pending (not confirmed): "
            f"{errors[0].__cause__ or errors[0]}; do not publish them again",
            receipts=[m.receipt for m in messages],
        ) from errors[0]
    if errors:
        raise errors[0]


def _not_sent(
    failures: dict[int, PublishError],
    messages: Sequence[OutgoingMessage],
    start: int,
    cause: BaseException,
) -> None:
    for i in range(start, len(messages)):
        failures[i] = PublishNotSent(
            f"message {messages[i].message_id!r} was never sent ({cause}); it is not at "
            "the broker, so publishing it again sends it once",
            messages[i].message_id,
        )
