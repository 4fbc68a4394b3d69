"""How large a message may be: checked before publish, so the broker never refuses one.

The defaults, and why:

- **body: 16 MiB.** RabbitMQ refuses messages above ``max_message_size``
  (128 MiB by default in 3.8 to 3.13, 16 MiB from 4.0; 512 MiB at most). A
  large body is held in memory by every queue it passes through and written to
  the quorum queues' Raft log once per tier hop, so a blob belongs in a blob
  store and its address in the message.
- **user headers: 64 of them, 16 KiB encoded.** The AMQP content header (every
  property, all headers) must fit in a single frame, ``frame_max`` (131,072
  bytes by default, negotiated per connection); a larger one makes RabbitMQ
  close the connection. delayq adds its own headers to every hop and, on a
  failure, the error type, message (1 KiB) and trace (8 KiB):
  :data:`DELAYQ_RESERVED_BYTES` of the frame stay free for them and for the
  properties, so a message accepted at publish can always be republished for
  a retry or to the dead-letter queue. The count bounds the per-message cost of
  copying headers on every hop.

Override them per topology (``limits:`` in the topology YAML, or
``Topology(limits=MessageLimits(...))``); a publisher's ``max_body_bytes=``
overrides the body limit alone.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from delayq.errors import InvalidInput

__all__ = [
    "DEFAULT_LIMITS",
    "DELAYQ_RESERVED_BYTES",
    "ERROR_TYPE_MAX_BYTES",
    "FRAME_MAX",
    "MAX_BODY_BYTES",
    "MAX_HEADERS",
    "MAX_HEADER_BYTES",
    "MIN_FRAME_MAX",
    "PROPERTIES_RESERVED_BYTES",
    "RABBITMQ_MAX_MESSAGE_BYTES",
    "MessageLimits",
]

FRAME_MAX = 131_072
"""RabbitMQ's default ``frame_max`` (bytes): the content header must fit in one frame."""
MIN_FRAME_MAX = 4_096
"""The smallest ``frame_max`` AMQP 0-9-1 allows."""
RABBITMQ_MAX_MESSAGE_BYTES = 512 * 1024 * 1024
"""RabbitMQ's ceiling for ``max_message_size``."""
MAX_BODY_BYTES = 16 * 1024 * 1024
MAX_HEADERS = 64
MAX_HEADER_BYTES = 16 * 1024
PROPERTIES_RESERVED_BYTES = 1024
"""Bytes of the content header frame besides the headers table: the frame's own
overhead (8), class, weight and body size (12), property flags (2), message id
and content type (up to 256 each), timestamp (8) and delivery mode (1)."""
ERROR_TYPE_MAX_BYTES = 255
"""Longest ``delayq-error-type`` (module and class name of a failure) delayq sends."""
DELAYQ_RESERVED_BYTES = 12 * 1024
"""Bytes of the content header frame kept for what delayq adds to user headers:
its ``delayq-*`` headers (with an 8 KiB trace and a 1 KiB error message on a
failure), the table and properties (message id and content type up to 255
bytes each) and the frame's own overhead: 10,846 bytes at most today. A unit
test encodes the largest dead letter delayq can build and checks that it fits."""


class MessageLimits(BaseModel):
    """Size limits of one message, the same for both publishers (see the module's notes)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_body_bytes: int = Field(default=MAX_BODY_BYTES, ge=0, le=RABBITMQ_MAX_MESSAGE_BYTES)
    """Largest encoded body; keep it at or below the broker's ``max_message_size``."""
    max_headers: int = Field(default=MAX_HEADERS, ge=0, le=10_000)
    """Most user headers a message may carry (delayq's own are not counted)."""
    max_header_bytes: int = Field(default=MAX_HEADER_BYTES, ge=0)
    """Largest AMQP encoding of the user headers (delayq's own are not counted)."""
    frame_max: int = Field(default=FRAME_MAX, ge=MIN_FRAME_MAX)
    """The broker's ``frame_max`` (bytes); set it when the broker lowers the default."""

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise _invalid(exc) from None

    @classmethod
    def model_validate(cls, obj: Any, *args: Any, **kwargs: Any) -> MessageLimits:
        try:
            return super().model_validate(obj, *args, **kwargs)
        except ValidationError as exc:
            raise _invalid(exc) from None

    @model_validator(mode="after")
    def _headers_fit_in_a_frame(self) -> MessageLimits:
        room = self.frame_max - DELAYQ_RESERVED_BYTES
        if room <= 0:
            raise ValueError(
                f"frame_max={self.frame_max} leaves no room for headers: delayq's own "
                f"headers and the properties need up to {DELAYQ_RESERVED_BYTES} bytes"
            )
        if self.max_header_bytes > room:
            raise ValueError(
                f"max_header_bytes={self.max_header_bytes} does not fit in a frame of "
                f"frame_max={self.frame_max} once delayq's own headers and the properties "
                f"(up to {DELAYQ_RESERVED_BYTES} bytes) are added: at most {room}"
            )
        return self

    def replace(self, **changes: Any) -> MessageLimits:
        """A copy with ``changes``; :class:`~delayq.errors.InvalidInput` if they break a rule."""
        return MessageLimits.model_validate({**self.model_dump(), **changes})


def _invalid(exc: ValidationError) -> InvalidInput:
    """pydantic's refusal as delayq's: one line naming each field and why (a refusal of
    delayq's own, raised by ``__init__`` inside pydantic's validation, as it was)."""
    for err in exc.errors():
        raised = err.get("ctx", {}).get("error")
        if isinstance(raised, InvalidInput):
            return raised
    problems = "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or 'limits'}: "
        f"{err['msg'].removeprefix('Value error, ')}"
        for err in exc.errors()
    )
    return InvalidInput(f"invalid message limits: {problems}")


DEFAULT_LIMITS = MessageLimits()
