"""Deliveries whose content header pika cannot read, handed over instead of raised.

pika 1.4 raises while it decodes a header table holding a float NaN or infinity (it
reads floats as integers), a timestamp past the year 9999, or a field type it does not
know; the exception ends ``process_data_events`` and so the consumer's connection. The
broker then delivers the same message again, to the same end, and each time every
message the consumer held comes back with it, counted towards the queue's delivery
limit: one message stops the consumer and strands the others. With
:func:`tolerate_unreadable_headers`, such a delivery arrives with empty properties and
:data:`UNREADABLE` set on them to what pika said, so the consumer can settle it (the
bridge rejects it to its queue's dead-letter queue, where the broker keeps it intact).
"""

from __future__ import annotations

import struct
from typing import Any

import pika
from pika import frame as pika_frame

__all__ = ["UNREADABLE", "tolerate_unreadable_headers", "unreadable"]

UNREADABLE = "delayq_unreadable"
"""The attribute of a delivery's ``pika.BasicProperties`` that says why its content
header could not be read (absent when it could)."""

_HEADER_FRAME = 2
_FRAME_END = 0xCE
_FRAME = struct.Struct(">HI").unpack_from  # after the type: channel, payload size
_CONTENT = struct.Struct(">HHQ").unpack_from  # class, weight, body size


def unreadable(properties: Any) -> str | None:
    """Why the content header of the delivery with these properties could not be read,
    or ``None``."""
    why = getattr(properties, UNREADABLE, None)
    return why if isinstance(why, str) else None


def tolerate_unreadable_headers(connection: Any) -> bool:
    """Have ``connection`` (pika's blocking connection) hand over a delivery whose content
    header it cannot decode, with :data:`UNREADABLE` set, instead of raising. ``False``
    for a pika without these internals (left as it is)."""
    impl = getattr(connection, "_impl", None)
    read = getattr(impl, "_read_frame", None)
    if impl is None or not callable(read):
        return False

    def read_frame() -> tuple[int, Any]:
        try:
            decoded: tuple[int, Any] = read()
        except Exception as exc:
            handed = _header_unread(getattr(impl, "_frame_buffer", b""), exc)
            if handed is None:
                raise
            return handed
        return decoded

    impl._read_frame = read_frame
    return True


def _header_unread(data: Any, exc: Exception) -> tuple[int, Any] | None:
    """A whole content header frame at the start of ``data``, as a frame of empty
    properties marked unreadable; ``None`` for anything else (pika's error stands)."""
    if not isinstance(data, (bytes, bytearray)) or len(data) < 7 + 12 + 1:
        return None
    if data[0] != _HEADER_FRAME:
        return None
    channel, size = _FRAME(data, 1)
    end = 7 + size
    if size < 12 or len(data) <= end or data[end] != _FRAME_END:
        return None
    _class, _weight, body_size = _CONTENT(data, 7)
    properties = pika.BasicProperties()
    setattr(properties, UNREADABLE, f"{type(exc).__name__}: {exc}"[:500])
    return end + 1, pika_frame.Header(channel, body_size, properties)
