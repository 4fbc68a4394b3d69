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

__all__ = ["Model", "check_binding_keys", "check_name", "problems"]

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")
_BINDING = re.compile(r"(?:[A-Za-z0-9_\-]+|\*|#)(?:\.(?:[A-Za-z0-9_\-]+|\*|#))*")


def check_name(value: str, what: str) -> str:
    if value == "amq" or value.startswith("amq."):
        raise ValueError(f"{what} {value!r} uses the prefix 'amq.', which RabbitMQ reserves")
    if len(value.encode()) > 200 or not _NAME.fullmatch(value):
        raise ValueError(
            f"{what} {value!r} must start with a letter or digit and use only letters, "
            "digits, '.', '_' and '-' (at most 200 bytes)"
        )
    return value


def check_binding_keys(value: tuple[str, ...]) -> tuple[str, ...]:
    for key in value:
        if len(key.encode()) > 255 or not _BINDING.fullmatch(key):
            raise ValueError(
                f"binding key {key!r} must be dot-separated words of letters, digits, "
                "'_' or '-', or the wildcards '*' and '#' (at most 255 bytes)"
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
