"""The ``delayq`` command line's option rules, on click.

* ``--url`` and ``--file`` stand wherever the help shows them: before the command
  (``delayq --url U publish``), between a group and its action (``delayq dlq --url U
  list q``) and after it. Each level records what it was given in the root context;
  :func:`merge_globals` joins them once the command is chosen: the value given anywhere
  wins, two different values are refused, and so is an option the command does not use
  (``--file`` for ``delayq worker``, whose module loads its own topology), with the reason.
  (On argparse, a value given before the command was overwritten by the sub-command's
  default: ``delayq --url U publish`` published to ``$DELAYQ_URL``.)
* Every other option given twice with different values (``-d 1s -d 2s``) is refused
  instead of the last one silently winning (:func:`once`).
* Options that exclude each other, or of which one is required, are declared on the
  :class:`Command` and checked before the command runs.
* An option several commands take (``--store``, ``--key-scope``, the Spark jobs'
  ``--master``, ``--errors``, ...) is declared once here, by a function that makes it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import click
from click.core import ParameterSource

from delayq.cli._common import Args
from delayq.cli.params import PathParam, PositiveInt, Prefetch, Rate
from delayq.stores.url import STORE_FORMS
from delayq.topology.default_file import DEFAULT_TOPOLOGY_FILE

__all__ = [
    "CONTEXT",
    "GLOBAL_DEFAULTS",
    "Command",
    "Invocation",
    "PathParam",
    "PositiveInt",
    "Prefetch",
    "Rate",
    "errors_options",
    "flag",
    "format_option",
    "global_options",
    "group",
    "json_flag",
    "key_scope_option",
    "leaf",
    "management",
    "master_option",
    "merge_globals",
    "once",
    "partitions_option",
    "queue_option",
    "rejected_options",
    "resolve",
    "store_option",
]

GLOBAL_DEFAULTS: dict[str, Any] = {"url": None, "file": DEFAULT_TOPOLOGY_FILE}
"""The options that may stand before or after the command, and their defaults."""

_GIVEN = "delayq.given"
_WHY = {"url": "it uses no broker", "file": "it reads no topology file"}


def _shown(value: Any) -> str:
    from delayq.urls import redact  # loads ssl (delayq.tls): not for every --help

    text = str(value)
    return repr(redact(text) if "://" in text else text)


def once(*decls: str, default: Any = None, **kwargs: Any) -> click.Option:
    """An option taking one value, refusing a second, different one (``-d 1s -d 2s``).

    click keeps the last value of a repeated option; this one collects them all
    (``multiple``) and reduces them to the one value, or says which two differ.
    """

    def reduce(ctx: click.Context, param: click.Parameter, values: Sequence[Any]) -> Any:
        distinct: list[Any] = []
        for value in values:
            if value not in distinct:
                distinct.append(value)
        if len(distinct) > 1:
            raise click.BadParameter(
                f"given twice with different values ({_shown(distinct[0])} and "
                f"{_shown(distinct[1])}): give it once",
                ctx,
                param,
            )
        return distinct[0] if distinct else default

    return click.Option(decls, multiple=True, callback=reduce, **kwargs)


def flag(*decls: str, help: str) -> click.Option:
    """A boolean switch (``--json``): off unless given."""
    return click.Option(decls, is_flag=True, default=False, help=help)


def _record(name: str) -> Callable[[click.Context, click.Parameter, Sequence[Any]], None]:
    def record(ctx: click.Context, param: click.Parameter, values: Sequence[Any]) -> None:
        given = ctx.find_root().meta.setdefault(_GIVEN, {})
        for value in values:
            given.setdefault(name, [])
            if value not in given[name]:
                given[name].append(value)

    return record


def global_options(*, url: bool = True, file: bool = True, where: str = "") -> list[click.Option]:
    """``--file`` and ``--url`` for one level of the command tree.

    Both are always parsed; one the level's command does not use is hidden from its help
    and refused by :func:`merge_globals` with the reason, not as an unknown option.
    """
    return [
        click.Option(
            ["--file", "-f"],
            multiple=True,
            type=PathParam(),
            metavar="FILE",
            expose_value=False,
            callback=_record("file"),
            hidden=not file,
            help=f"topology YAML (default {DEFAULT_TOPOLOGY_FILE}){where}",
        ),
        click.Option(
            ["--url"],
            multiple=True,
            metavar="URL",
            expose_value=False,
            callback=_record("url"),
            hidden=not url,
            help="broker URL (default: $DELAYQ_URL, $RABBITMQ_URL, "
            f"amqp://guest:guest@localhost:5672/){where}",
        ),
    ]


def merge_globals(ctx: click.Context, *, url: bool, file: bool) -> dict[str, Any]:
    """``url``/``file`` for the chosen command, from whatever level gave them."""
    given: dict[str, list[Any]] = ctx.find_root().meta.get(_GIVEN, {})
    merged: dict[str, Any] = {}
    for name, used in (("url", url), ("file", file)):
        values = given.get(name, [])
        if values and not used:
            raise click.UsageError(
                f"--{name} has no effect on `{ctx.command_path}` ({_WHY[name]}): leave it out",
                ctx,
            )
        if len(values) > 1:
            raise click.UsageError(
                f"--{name} given with different values "
                f"({', '.join(_shown(v) for v in values)}): give it once",
                ctx,
            )
        if used:
            merged[name] = values[0] if values else GLOBAL_DEFAULTS[name]
    return merged


def _given(ctx: click.Context, name: str) -> bool:
    return ctx.get_parameter_source(name) not in (None, ParameterSource.DEFAULT)


class Command(click.Command):
    """A leaf command: options that exclude each other (``exclusive``) and groups of which
    exactly one must be given (``one_of``), checked before the command runs."""

    handler: Handler | str | None = None
    """What the command runs (set by :func:`leaf`)."""

    def __init__(
        self,
        *args: Any,
        exclusive: Sequence[Sequence[str]] = (),
        one_of: Sequence[Sequence[str]] = (),
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.exclusive = [tuple(group) for group in (*exclusive, *one_of)]
        self.one_of = [tuple(group) for group in one_of]

    def option_name(self, dest: str) -> str:
        for param in self.params:
            if param.name == dest and isinstance(param, click.Option):
                return max(param.opts, key=len)
        return dest

    def check_groups(self, ctx: click.Context) -> None:
        for group in self.exclusive:
            given = [name for name in group if _given(ctx, name)]
            if len(given) > 1:
                first, second = (self.option_name(name) for name in given[:2])
                raise click.UsageError(f"{second} is not allowed with {first}", ctx)
        for group in self.one_of:
            if not any(_given(ctx, name) for name in group):
                names = " or ".join(self.option_name(name) for name in group)
                raise click.UsageError(f"one of {names} is required", ctx)


CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
Handler = Callable[[Args], int]


@dataclass(frozen=True)
class Invocation:
    """What a command line asks for: ``handler(args)``.

    ``handler`` may be named ``"module:function"``: it is imported only to run, so
    building the command tree (``delayq --help``) loads no command's implementation."""

    handler: Handler | str
    args: Args

    def run(self) -> int:
        return resolve(self.handler)(self.args)


def resolve(handler: Handler | str) -> Handler:
    """``handler``, imported first if it is named ``"module:function"``."""
    if not isinstance(handler, str):
        return handler
    import importlib

    module, _, name = handler.partition(":")
    found: Handler = getattr(importlib.import_module(module), name)
    return found


def leaf(
    name: str,
    handler: Handler | str,
    help: str,
    params: Sequence[click.Parameter] = (),
    *,
    url: bool,
    file: bool,
    names: dict[str, str] | None = None,
    exclusive: Sequence[Sequence[str]] = (),
    one_of: Sequence[Sequence[str]] = (),
) -> Command:
    """A command that runs ``handler``: its own ``params`` after ``--file``/``--url`` (shown
    where ``url``/``file`` say it uses them), ``names`` added to its :class:`Args` (the
    group and action chosen), and the groups :class:`Command` checks."""

    def callback(**values: Any) -> Invocation:
        ctx = click.get_current_context()
        command.check_groups(ctx)
        values.update(merge_globals(ctx, url=url, file=file))
        return Invocation(handler, Args(**values, **(names or {})))

    command = Command(
        name,
        callback=callback,
        params=[*global_options(url=url, file=file), *params],
        help=help,
        short_help=help,
        exclusive=exclusive,
        one_of=one_of,
        context_settings=CONTEXT,
    )
    command.handler = handler
    return command


def group(name: str, help: str, commands: Sequence[click.Command]) -> click.Group:
    """A group of actions (``topology``, ``dlq``), taking ``--file``/``--url`` itself too."""
    made = click.Group(
        name, params=global_options(), help=help, short_help=help, context_settings=CONTEXT
    )
    for command in commands:
        made.add_command(command)
    return made


def management() -> list[click.Option]:
    """``--management-url`` and ``--no-management``: how a command may read the HTTP API."""
    return [
        once(
            "--management-url",
            help="management HTTP API, e.g. http://user:pass@host:15672/ (default: "
            "$DELAYQ_MANAGEMENT_URL, else the AMQP URL's host and user on port 15672)",
        ),
        flag("--no-management", help="use AMQP only, even if the API answers"),
    ]


def json_flag(what: str = "print JSON instead of text") -> click.Option:
    """``--json``: one JSON document on stdout instead of text."""
    return flag("--json", help=what)


# options several commands declare alike --------------------------------------------


def store_option(
    *, where: str = "", help: str | None = None, required: bool = True
) -> click.Option:
    """``--store URL``: the consumers' idempotency store (``delayq cancel``, ``reschedule``,
    ``dlq replay``, ``spark cancel``); ``where`` is added to the help."""
    return once(
        "--store",
        required=required,
        metavar="URL",
        help=help or f"the consumers' idempotency store: {STORE_FORMS}{where}",
    )


def key_scope_option() -> click.Option:
    """``--key-scope``: how the consumers scope their keys (queue or shared)."""
    return once(
        "--key-scope",
        type=click.Choice(["queue", "shared"]),
        default="queue",
        help="the consumers' key_scope (default queue)",
    )


def queue_option() -> click.Option:
    """``--queue Q`` (repeatable): a queue a cancel also marks."""
    return click.Option(
        ["--queue", "queues"],
        multiple=True,
        metavar="Q",
        help="also mark this queue (bound outside the topology file); repeatable",
    )


def master_option() -> click.Option:
    """``--master``: the Spark master of a ``delayq spark`` job."""
    return once("--master", help="Spark master (default: local[*], or what spark-submit set)")


def format_option() -> click.Option:
    """``--format``: how a Spark job reads its INPUT."""
    return once(
        "--format",
        type=click.Choice(["parquet", "csv", "jsonl"]),
        help="default: from INPUT's extension",
    )


def partitions_option(help: str) -> click.Option:
    """``--partitions N``: a Spark job's partitions (``help`` says what each one holds)."""
    return once("--partitions", type=PositiveInt(), help=help)


def errors_options() -> list[click.Option]:
    """``--errors DIR`` and ``--errors-format``: where a Spark job writes rejected rows."""
    return [
        once("--errors", metavar="DIR", help="write rejected rows here (default: print them)"),
        once(
            "--errors-format",
            type=click.Choice(["json", "csv", "parquet"]),
            default="json",
            help="default json",
        ),
    ]


def rejected_options() -> list[click.Option]:
    """``--max-rejected`` and ``--allow-rejected``: how many rejected rows a Spark job
    accepts before it exits 1 (the two exclude each other)."""
    return [
        once(
            "--max-rejected",
            default="0",
            metavar="N|P%",
            help="rejected rows the job accepts: a count, or a percentage of the rows "
            "(default 0: any rejected row makes the job exit 1)",
        ),
        flag("--allow-rejected", help="exit 0 however many rows were rejected (read the summary)"),
    ]
