"""No ``delayq`` command prints a traceback, whatever its arguments (issue 48, item 5).

Every command and every option of the click app gets each value of :data:`VALUES`
(format placeholders, paths that exist or cannot, a file where a folder goes, empty and
huge values, negative numbers, wrong units, unicode), one option at a time, the
command's arguments filled in. The command runs in this process, against a broker
port nobody listens on (``DELAYQ_URL``, and the management API likewise), in a
temporary working directory. It must end with an exit code and no traceback; one that
fails must not exit 0.

Left out, each for its reason: a NUL byte (no command line can carry one: exec takes
C strings), and Spark itself (a stub session that refuses: what is fuzzed is the
command line in front of it, and a JVM start takes seconds).
"""

from __future__ import annotations

import socket
import traceback
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from delayq.cli import build_cli, main
from delayq.errors import InvalidInput

TOPOLOGY = Path(__file__).resolve().parents[2] / "topology" / "delayq.yaml"


def _closed_port() -> int:
    with socket.socket() as probe:  # bound, never listening: connections are refused
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def values(tmp: Path) -> list[str]:
    a_file = tmp / "a-file"
    a_file.write_text("x")
    return [
        "{0}",
        "{exchange}.{x}",
        "%s",
        "",
        "x" * 5000,
        "-1",
        "0",
        "15",
        "15x",
        "-1s",
        "1e999",
        "nan",
        "ünïcødé ☃ 日本",
        str(tmp),  # a folder that exists
        "/nonexistent/x",
        str(a_file),  # a file where a folder may be expected
        f"{a_file}/x",
        "/dev/null/x",
        "-",
    ]


def _leaves(group: click.Group, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from _leaves(command, (*path, name))
        else:
            yield (*path, name)


def _command(path: tuple[str, ...]) -> click.Command:
    command: click.Command = build_cli()
    for name in path:
        assert isinstance(command, click.Group)
        command = command.commands[name]
    return command


COMMANDS = sorted(_leaves(build_cli()))


def _lines(command: click.Command, path: tuple[str, ...], tmp: Path) -> Iterator[list[str]]:
    """Each argument and each option taking a value, given each value in turn."""
    arguments = [p for p in command.params if isinstance(p, click.Argument)]
    filler = {"shell": "bash"}  # the one choice among the arguments
    options = [
        p for p in command.params if isinstance(p, click.Option) and not p.is_flag and not p.hidden
    ]
    # --file is given (the repository's topology) unless it is what is fuzzed
    uses_file = any(p.name == "file" and not p.hidden for p in command.params)
    for value in values(tmp):
        for fuzzed in [*arguments, *options]:
            line = [*path]
            for argument in arguments:
                line.append(value if argument is fuzzed else filler.get(str(argument.name), "q"))
            if isinstance(fuzzed, click.Option):
                line += [max(fuzzed.opts, key=len), value]
            if uses_file and fuzzed.name != "file":
                line += ["--file", str(TOPOLOGY)]
            yield line


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[CliRunner]:
    port = _closed_port()
    monkeypatch.chdir(tmp_path)  # what a command writes (--output 15) lands here
    # the closed port refuses at once; its retries' pauses are not under test
    monkeypatch.setattr("delayq.retrying.pause_s", lambda round_, backoff_s: 0.0)

    def no_spark(args: object) -> object:
        raise InvalidInput("this test starts no Spark session")

    monkeypatch.setattr("delayq.cli.spark._spark_session", no_spark)
    yield CliRunner(
        env={
            "DELAYQ_URL": f"amqp://guest:guest@127.0.0.1:{port}/",
            "DELAYQ_MANAGEMENT_URL": f"http://guest:guest@127.0.0.1:{port}/",
            "RABBITMQ_URL": None,
            "DELAYQ_MASK_HEADERS": None,
        }
    )


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_no_argument_makes_a_command_print_a_traceback(
    path: tuple[str, ...], isolated: CliRunner, tmp_path: Path
) -> None:
    failures = []
    for line in _lines(_command(path), path, tmp_path):
        with isolated.isolation() as (out, err, _):
            try:
                code: object = main(line)
                raised = ""
            except SystemExit as exc:  # not expected either: main returns its code
                code, raised = exc.code, f"SystemExit({exc.code!r})"
            except BaseException:  # what would reach the user as a traceback
                code, raised = None, traceback.format_exc(limit=-3)
            printed = out.getvalue().decode(errors="replace") + (
                err.getvalue().decode(errors="replace") if err is not None else ""
            )
        shown = [word[:40] for word in line]
        if raised or "Traceback" in printed or not isinstance(code, int):
            failures.append(f"{shown}: {raised or printed[-400:]}")
        elif code == 0 and "delayq: error" in printed:
            failures.append(f"{shown}: exit 0 after {printed[-200:]!r}")
    assert not failures, "\n".join(failures[:10])


def test_the_fuzz_reaches_every_command_and_option() -> None:
    """Not vacuous: the tree walked is the whole app's."""
    assert {" ".join(p) for p in COMMANDS} >= {"publish", "dlq show", "spark report", "cancel"}
    assert len(COMMANDS) > 25
