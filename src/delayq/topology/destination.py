"""A destination: an application queue, bound by routing keys to the ready exchange or
by x-match tables to the headers exchange (:mod:`delayq.topology.headers`).

>>> Destination(queue="emails", bindings=["email.*"]).dlq
'emails.dlq'
"""

from __future__ import annotations

from pydantic import ConfigDict, Field, field_validator, model_validator

from delayq.topology._validation import Model, check_binding_keys, check_name
from delayq.topology.headers import HeaderTable, check_tables

__all__ = ["Destination"]


class Destination(Model):
    """An application queue bound to the ready exchange by routing keys, or to the
    headers exchange by x-match tables (see :mod:`delayq.topology.headers`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    queue: str
    bindings: tuple[str, ...] = ()
    """Topic binding keys on ``<ns>.ready``."""
    headers: tuple[HeaderTable, ...] = ()
    """x-match tables, each a binding from ``<ns>.headers``: ``{"x-match": "any",
    "tenant": "acme"}``."""
    delivery_limit: int = Field(default=20, ge=1, le=1000)
    """Broker backstop: deliveries before a quorum queue dead-letters a message that
    keeps crashing its consumer (``x-delivery-limit``)."""
    existing: bool = False
    """A queue that is not delayq's (bound to the delayed-message plugin's exchange, say):
    ``apply`` only binds it, never declares or changes it, and declares no DLQ or retry
    binding for it; consume it with your own consumer (a delayq consumer refuses it)."""

    @field_validator("queue")
    @classmethod
    def _queue_name(cls, value: str) -> str:
        check_name(value, "queue name", suffix=".dlq", why="to name its dead-letter queue")
        if value.endswith(".dlq"):
            raise ValueError(f"queue name {value!r} must not end in '.dlq' (reserved for DLQs)")
        return value

    @field_validator("bindings")
    @classmethod
    def _binding_keys(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return check_binding_keys(value)

    @field_validator("headers")
    @classmethod
    def _header_tables(cls, value: tuple[HeaderTable, ...]) -> tuple[HeaderTable, ...]:
        return check_tables(value)

    @model_validator(mode="after")
    def _bound(self) -> Destination:
        if not self.bindings and not self.headers:
            raise ValueError(
                f"destination {self.queue!r} has no bindings (routing keys) and no headers "
                "(x-match tables): it would receive nothing"
            )
        return self

    @property
    def dlq(self) -> str:
        return f"{self.queue}.dlq"
