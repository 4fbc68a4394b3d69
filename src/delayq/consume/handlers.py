"""What a handler may be: checks both consumers share, before and after calling one.

A generator function, or an async function given where a plain one is expected,
"runs" without running its body: the delivery would be acked as done with no
effect. These are refused when the consumer is built, or, when a wrapper hides
them, the delivery fails with a clear error instead of succeeding silently.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from delayq.errors import InvalidInput

__all__ = ["check_handler", "check_signature", "is_coroutine_handler", "plain", "plain_result"]


def is_coroutine_handler(handler: Callable[..., Any]) -> bool:
    """A coroutine function, or an object whose ``__call__`` is one."""
    call = getattr(handler, "__call__", None)  # noqa: B004 - the instance's own __call__
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call)


def check_handler(
    handler: Callable[..., Any], *, sync: bool, transactional: bool = False
) -> None:
    """Refuse a handler whose call would run nothing (``sync``: for a thread), or that
    cannot take what delayq passes it (``transactional``: the body and the transaction)."""
    if not callable(handler):
        raise InvalidInput(f"handler must be a function, got {type(handler).__name__}")
    if sync and is_coroutine_handler(handler):
        raise InvalidInput("handler is a coroutine function: use delayq.aio.AsyncConsumer")
    if inspect.isgeneratorfunction(handler) or inspect.isasyncgenfunction(handler):
        raise InvalidInput(
            "handler is a generator function: calling it runs none of its body; "
            "make it a plain or async function (return, do not yield)"
        )
    check_signature(handler, transactional=transactional)


def check_signature(handler: Callable[..., Any], *, transactional: bool = False) -> None:
    """Refuse a handler that cannot be called as ``handler(body)`` (``handler(body, tx)``
    when transactional), positionally, as both consumers call it: otherwise every
    delivery fails with a TypeError and is retried until its attempts are spent."""
    try:
        signature = inspect.signature(handler)
    except (TypeError, ValueError):
        return  # some builtins have no signature to read: their call will tell
    wanted = "handler(body, tx)" if transactional else "handler(body)"
    try:
        signature.bind(*(None,) * (2 if transactional else 1))
    except TypeError as exc:
        name = getattr(handler, "__qualname__", None) or repr(handler)
        empty = inspect.Parameter.empty  # the parameters are what matters, not their types
        signature = signature.replace(
            parameters=[p.replace(annotation=empty) for p in signature.parameters.values()],
            return_annotation=empty,
        )
        what = (
            "the decoded body, then the store's transaction"
            if transactional
            else "one positional argument, the decoded body"
        )
        raise InvalidInput(
            f"handler {name}{signature} cannot be called as {wanted} ({exc}): "
            f"delayq passes it {what}"
        ) from None


def plain_result(result: object) -> None:
    """Check what a plain handler returned: a coroutine or generator means it ran
    nothing (an async or generator function behind a wrapper), so the delivery fails
    with that reason rather than being acked as done."""
    if inspect.isawaitable(result) or inspect.isgenerator(result) or inspect.isasyncgen(result):
        close = getattr(result, "close", None)
        if callable(close) and not inspect.isasyncgen(result):
            close()  # no "never awaited" warning on top
        raise InvalidInput(
            f"the handler returned a {type(result).__name__} instead of running: an async "
            "or generator function behind a wrapper? A plain handler must do its work "
            "when called (coroutine handlers: AsyncConsumer, unwrapped)"
        )


def plain(handler: Callable[..., Any]) -> Callable[..., None]:
    """``handler``, failing with :func:`plain_result`'s reason when a call runs nothing."""

    @functools.wraps(handler)
    def call(*args: Any, **kwargs: Any) -> None:
        plain_result(handler(*args, **kwargs))

    return call
