"""Clear refusals of the wrong ``with``: mixins for classes used one way only.

Without them ``with AsyncPublisher(...)`` fails with ``AttributeError: __enter__``
(or a TypeError about "the context manager protocol"), which names neither the
class nor the fix. Python looks up both methods of a protocol before calling the
first, so each mixin defines the pair; the second is never reached.
"""

from __future__ import annotations

from typing import Any, ClassVar, NoReturn

from delayq.errors import InvalidInput

__all__ = ["NoAsyncContext", "NoContext", "NoSyncContext"]


class NoSyncContext:
    """For an async context manager: ``with`` says to write ``async with``."""

    def __enter__(self) -> NoReturn:
        name = type(self).__name__
        raise InvalidInput(
            f"{name} is an async context manager: write `async with {name}(...) as x:` "
            "inside a coroutine, not `with`"
        )

    def __exit__(self, *exc: object) -> None:
        return None  # never reached: __enter__ raised


class NoAsyncContext:
    """For a sync context manager: ``async with`` says to write ``with``."""

    # A plain def raising at once: ``async with`` calls it before awaiting anything.
    def __aenter__(self) -> NoReturn:
        name = type(self).__name__
        raise InvalidInput(
            f"{name} is a sync context manager: write `with {name}(...) as x:`, not "
            "`async with` (the async one is delayq.aio.AsyncPublisher)"
        )

    def __aexit__(self, *exc: object) -> Any:
        return None  # never reached: __aenter__ raised


class NoContext(NoSyncContext, NoAsyncContext):
    """For a class that is no context manager at all: both say what to call instead."""

    _instead: ClassVar[str] = ""
    """What to write instead, for the message."""

    def _refuse(self) -> NoReturn:
        raise InvalidInput(f"{type(self).__name__} is not a context manager: {self._instead}")

    def __enter__(self) -> NoReturn:
        self._refuse()

    def __aenter__(self) -> NoReturn:
        self._refuse()
