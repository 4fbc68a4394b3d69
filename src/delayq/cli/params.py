"""The value types of the ``delayq`` command line's options, each a bound it checks
before the command runs (:mod:`delayq.cli.options` declares the options)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

__all__ = ["PathParam", "PositiveInt", "Prefetch", "Rate"]


def PositiveInt() -> click.IntRange:
    """A whole number of at least 1 (``--limit 0`` listed nothing and said the queue was
    empty; ``--concurrency -1`` died with a traceback)."""
    return click.IntRange(min=1)


class PathParam(click.Path[Path]):
    """A path option or argument, as a :class:`~pathlib.Path`, refusing the empty string:
    ``Path("")`` is ``.``, so ``--out ''`` wrote into the current folder (exit 0)."""

    def __init__(self) -> None:
        super().__init__(path_type=Path)

    def convert(
        self,
        value: str | os.PathLike[str],
        param: click.Parameter | None,
        ctx: click.Context | None,
    ) -> Path:
        if isinstance(value, str) and not value:
            self.fail("is empty: name a file or folder ('.' for the current one)", param, ctx)
        return super().convert(value, param, ctx)


def Prefetch() -> click.IntRange:
    """A prefetch count, 1 to 65535: AMQP carries it in 16 bits (``--prefetch 70000``
    failed after connecting, exit 1)."""
    from delayq.consume.settings import MAX_PREFETCH

    return click.IntRange(min=1, max=MAX_PREFETCH)


class Rate(click.ParamType[float, Any]):
    """Messages per second, one a day to 1e12 (:func:`delayq.ops.pace.check_rate`):
    ``--rate 0`` or ``-5`` meant no limit at all, ``1e-300`` overflowed after the first
    message."""

    name = "rate"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        from delayq.errors import InvalidInput
        from delayq.ops.pace import check_rate

        number = click.FLOAT.convert(value, param, ctx)
        try:
            return check_rate(number)
        except InvalidInput as exc:
            self.fail(str(exc), param, ctx)
