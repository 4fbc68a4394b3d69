"""What every topology model shares: names checked, and refusals as InvalidTopology.

Pydantic's own ``ValidationError`` never reaches users: :class:`Model` turns it
into :class:`~delayq.errors.InvalidTopology`, one line naming every field it
refused and why.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from delayq.errors import InvalidTopology

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = [
    "MAX_NAME_BYTES",
    "NAME_ALPHABET",
    "Model",
    "check_alphabet",
    "check_binding_keys",
    "check_name",
    "problems",
    "shown",
]

MAX_NAME_BYTES = 255
"""RabbitMQ's limit on an exchange or queue name and a routing key (an AMQP short
string), in UTF-8 bytes."""

NAME_ALPHABET = "ASCII letters, digits and . _ -"
"""What a namespace or queue name is made of (starting with a letter or digit): the
least-privilege grants build regular expressions of names, and every client, URL and
file that carries one (the management API's paths, the definitions export, the YAML)
takes these as they are."""

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")
_NAME_CHAR = re.compile(r"[A-Za-z0-9_.\-]")
_BINDING = re.compile(r"(?:[A-Za-z0-9_\-]+|\*|#)(?:\.(?:[A-Za-z0-9_\-]+|\*|#))*")


def shown(value: str) -> str:
    """``value`` quoted for a message, shortened when long (a 300-byte name in full
    would bury what the message says about it)."""
    return repr(value) if len(value) <= 60 else f"{value[:40]!r}... ({len(value)} characters)"


def check_name(value: str, what: str, *, suffix: str = "", why: str = "") -> str:
    """``value`` as a name: :data:`NAME_ALPHABET` (:func:`check_alphabet`), and short
    enough that ``value`` + ``suffix`` (what delayq adds to form an entity name; ``why``
    says what for) fits in :data:`MAX_NAME_BYTES`. Raises ``ValueError`` saying what is
    wrong."""
    check_alphabet(value, what)
    size, room = len(value.encode("utf-8")), MAX_NAME_BYTES - len(suffix.encode("utf-8"))
    if size > room:
        added = f", and delayq adds {suffix!r} {why}" if suffix else ""
        raise ValueError(
            f"{what} {shown(value)} is {size} bytes long; it may have at most {room} bytes "
            f"(RabbitMQ takes names of up to {MAX_NAME_BYTES} bytes{added})"
        )
    return value


def check_alphabet(value: str, what: str) -> str:
    """``value`` in :data:`NAME_ALPHABET`, starting with a letter or digit, and not
    RabbitMQ's reserved ``amq.``; its length is checked apart."""
    if value == "amq" or value.startswith("amq."):
        raise ValueError(f"{what} {value!r} uses the prefix 'amq.', which RabbitMQ reserves")
    if not value:
        raise ValueError(f"{what} is empty; use {NAME_ALPHABET}")
    if not _NAME.fullmatch(value):
        bad = next((c for c in value if not _NAME_CHAR.fullmatch(c)), None)
        if bad is None:  # every character is allowed: the first one may not start a name
            raise ValueError(
                f"{what} {shown(value)} must start with an ASCII letter or digit, not "
                f"{value[0]!r} (names use {NAME_ALPHABET})"
            )
        raise ValueError(
            f"{what} {shown(value)} contains {bad!r}: names use only {NAME_ALPHABET}, "
            "starting with a letter or digit"
        )
    return value


def check_binding_keys(value: tuple[str, ...]) -> tuple[str, ...]:
    for key in value:
        size = len(key.encode("utf-8"))
        if size > MAX_NAME_BYTES:
            raise ValueError(
                f"binding key {shown(key)} is {size} bytes long; AMQP allows at most "
                f"{MAX_NAME_BYTES} bytes"
            )
        if not _BINDING.fullmatch(key):
            raise ValueError(
                f"binding key {shown(key)} must be dot-separated words of ASCII letters, "
                "digits, '_' or '-', or the wildcards '*' and '#'"
            )
    if len(set(value)) != len(value):
        raise ValueError("binding keys must be unique")
    return value


def _problem_list(exc: ValidationError, outer: tuple[str | int, ...] = ()) -> list[str]:
    problems = []
    for err in exc.errors():
        loc = (*outer, *err["loc"])
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, InvalidTopology) and isinstance(cause.__cause__, ValidationError):
            # A nested model refused its part (its __init__ raised): name its fields in full.
            problems.extend(_problem_list(cause.__cause__, loc))
            continue
        msg = err["msg"].removeprefix("Value error, ")
        problems.append(f"{'.'.join(str(p) for p in loc)}: {msg}" if loc else msg)
    return problems


def problems(source: str, exc: ValidationError) -> str:
    """One line naming every field pydantic refused, and why."""
    return f"{source}: {'; '.join(_problem_list(exc))}"


class Model(BaseModel):
    """Refuses bad input with :class:`~delayq.errors.InvalidTopology`, never pydantic's
    own ``ValidationError``: ``except DelayqError`` (or ``ValueError``) catches a bad
    ``Topology(...)``, as it catches every other delayq error."""

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise InvalidTopology(problems(type(self).__name__, exc)) from exc

    @classmethod
    def model_validate(cls, obj: Any, *args: Any, **kwargs: Any) -> Self:
        try:
            return super().model_validate(obj, *args, **kwargs)
        except ValidationError as exc:
            raise InvalidTopology(problems(cls.__name__, exc)) from exc
