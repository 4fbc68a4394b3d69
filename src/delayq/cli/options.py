"""Parsing the ``delayq`` command line: options that may stand before or after the command.

``--url`` and ``--file`` are accepted before the command (``delayq --url U publish``),
between a command and its action (``delayq dlq --url U list q``) and after it
(``delayq publish --url U``). argparse sub-parsers parse into a fresh namespace and
copy it over their parent's, defaults included, so a value given before the command
used to be overwritten by the sub-parser's default: ``delayq --url U publish`` then
published to ``$DELAYQ_URL``. Here every place an option can stand parses into a name
of its own (``url@1``, ``url@2``, ...), and :class:`GlobalOptions` merges them once the
whole line is parsed: the value given anywhere wins; two different values are refused,
and so is an option the command does not use (``--file`` for ``delayq worker``, whose
module loads its own topology). Any option given twice with different values
(``-d 1s -d 2s``) is refused too, instead of the last one silently winning.
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from delayq.topology.model import DEFAULT_TOPOLOGY_FILE
from delayq.urls import redact

__all__ = [
    "GLOBAL_DEFAULTS",
    "GlobalOptions",
    "Parser",
    "global_options",
    "positive_float",
    "positive_int",
]

GLOBAL_DEFAULTS: dict[str, Any] = {"url": None, "file": DEFAULT_TOPOLOGY_FILE}
"""The options that may stand before or after the command, and their defaults."""

_GIVEN = "_given:"
_UNUSED = "unused-"
_ids = itertools.count(1)


def _shown(value: Any) -> str:
    text = str(value)
    return repr(redact(text) if "://" in text else text)


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1 (``--limit 0`` listed nothing and
    said the queue was empty; ``--concurrency -1`` died with a traceback)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a number above 0 (``--rate 0`` or ``-5`` meant no limit at all)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number above 0, not {text}")
    return value


class _StoreOnce(argparse._StoreAction):
    """``store``, refusing a second, different value for the same option."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        marker = _GIVEN + self.dest
        if option_string is not None and getattr(namespace, marker, False):
            previous = getattr(namespace, self.dest, None)
            if previous != values:
                raise argparse.ArgumentError(
                    self,
                    f"given twice with different values ({_shown(previous)} and "
                    f"{_shown(values)}): give it once",
                )
        setattr(namespace, marker, True)
        super().__call__(parser, namespace, values, option_string)


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose plain options refuse a second, different value."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.register("action", None, _StoreOnce)
        self.register("action", "store", _StoreOnce)


def global_options(*, url: bool = True, file: bool = True, where: str = "") -> Parser:
    """A parent parser with ``--file`` and/or ``--url``, stored under names of their own.

    Give a fresh one to each level of the command tree (the top, a command, an action)
    so a level cannot overwrite what another parsed; siblings may share one.
    """
    n = next(_ids)
    common = Parser(add_help=False)
    # An option the command does not use is still parsed (hidden, as unused-<name>@n)
    # so that it is refused with the reason, not as an unrecognized argument.
    common.add_argument(
        "--file",
        "-f",
        dest=f"{'' if file else _UNUSED}file@{n}",
        metavar="FILE",
        default=argparse.SUPPRESS,
        type=Path,
        help=f"topology YAML (default {DEFAULT_TOPOLOGY_FILE}){where}"
        if file
        else argparse.SUPPRESS,
    )
    common.add_argument(
        "--url",
        dest=f"{'' if url else _UNUSED}url@{n}",
        metavar="URL",
        default=argparse.SUPPRESS,
        help="broker URL (default: $DELAYQ_URL, $RABBITMQ_URL, "
        f"amqp://guest:guest@localhost:5672/){where}"
        if url
        else argparse.SUPPRESS,
    )
    return common


def _leaf(action: argparse._SubParsersAction[Any], namespace: argparse.Namespace) -> Any:
    """The parser of the innermost command chosen (``delayq dlq list`` -> ``list``)."""
    parser: Any = action.choices[getattr(namespace, str(action.dest))]
    while True:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        chosen = getattr(namespace, str(subs[0].dest), None) if subs else None
        if chosen is None:
            return parser
        parser = subs[0].choices[chosen]


class GlobalOptions(argparse._SubParsersAction):  # type: ignore[type-arg]
    """The top level's sub-command action: once the command's own parser is done,
    merges the ``--url``/``--file`` values given at every level into ``url``/``file``."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        super().__call__(parser, namespace, values, option_string)
        leaf = _leaf(self, namespace)
        for name, default in GLOBAL_DEFAULTS.items():
            given: list[Any] = []
            for attr in [a for a in vars(namespace) if a.split("@")[0] in (name, _UNUSED + name)]:
                if getattr(namespace, attr) not in given:
                    given.append(getattr(namespace, attr))
                delattr(namespace, attr)
            offered = any(a.dest.startswith(f"{name}@") for a in leaf._actions)
            if given and not offered:
                why = "it uses no broker" if name == "url" else "it reads no topology file"
                raise argparse.ArgumentError(
                    None, f"--{name} has no effect on `{leaf.prog}` ({why}): leave it out"
                )
            if len(given) > 1:
                raise argparse.ArgumentError(
                    None,
                    f"--{name} given with different values "
                    f"({', '.join(_shown(v) for v in given)}): give it once",
                )
            if offered:
                setattr(namespace, name, given[0] if given else default)
        for attr in [a for a in vars(namespace) if a.startswith(_GIVEN)]:
            delattr(namespace, attr)
