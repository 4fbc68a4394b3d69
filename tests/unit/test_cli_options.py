"""`--url` and `--file` work wherever the help shows them, or are refused (issue 12, item 6);
any other option given twice with different values is refused; options that exclude each
other, or of which one is required, are checked (the click command line, issue 13).

The command tree is walked from the click app itself, so a new command or action is
covered without touching this file.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from delayq import __version__
from delayq.cli import EXIT_BROKER, EXIT_INPUT, build_cli, main, parse
from delayq.cli.options import Command, Invocation
from delayq.topology.model import DEFAULT_TOPOLOGY_FILE
from delayq.wording import counted

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGY = ROOT / "topology" / "delayq.yaml"
DEAD_URL = "amqp://guest:s3cret@127.0.0.1:1/"
GIVEN = {"url": "amqp://u:pw@elsewhere:5673/", "file": "other/topology.yaml"}
EXPECTED = {"url": GIVEN["url"], "file": Path(GIVEN["file"])}


def _leaves(command: click.Command, path: tuple[str, ...] = ()) -> Iterator[tuple]:
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from _leaves(sub, (*path, name))
    else:
        yield path, command


def _sample(param: click.Parameter) -> str:
    if isinstance(param.type, click.Choice):
        return str(param.type.choices[0])
    return "1"  # a valid int, float, positive count, path or name alike


def _minimal_args(leaf: click.Command) -> list[str]:
    """The leaf's arguments, required options and one member of each required group."""
    argv: list[str] = []
    firsts = {group[0] for group in getattr(leaf, "one_of", [])}
    for param in leaf.params:
        if isinstance(param, click.Argument):
            argv.append(_sample(param))
        elif isinstance(param, click.Option) and (param.required or param.name in firsts):
            argv += [param.opts[0], *([] if param.is_flag else [_sample(param)])]
    return argv


LEAVES = sorted(
    ((p, c) for p, c in _leaves(build_cli()) if p != ("completion",)), key=lambda item: item[0]
)
IDS = [" ".join(path) for path, _ in LEAVES]


def _shows(leaf: click.Command, name: str) -> bool:
    return any(p.name == name and not getattr(p, "hidden", False) for p in leaf.params)


def _argv(path: tuple[str, ...], leaf, at: int, option: list[str]) -> list[str]:
    """``option`` inserted after ``at`` command words (``at == len(path) + 1``: at the end)."""
    words, rest = list(path), _minimal_args(leaf)
    if at <= len(path):
        return [*words[:at], *option, *words[at:], *rest]
    return [*words, *rest, *option]


def _args(argv: list[str]):
    invocation = parse(argv)
    assert isinstance(invocation, Invocation), argv
    return invocation.args


def _refused(argv: list[str]) -> str:
    with pytest.raises(click.UsageError) as refused:
        parse(argv)
    return refused.value.format_message()


def test_the_walk_finds_every_command_path():
    found = set(IDS)
    assert {"publish", "stats", "worker", "demo", "retry-plan"} <= found
    assert {"topology plan", "topology apply", "topology verify", "topology grant"} <= found
    assert {
        f"{p} {a}" for p in ("dlq", "unrouted") for a in ("list", "show", "replay", "purge")
    } <= found
    assert {"spark schedule", "spark cancel", "spark report"} <= found
    assert all(isinstance(leaf, Command) for _, leaf in LEAVES)


@pytest.mark.parametrize("name", ["url", "file"])
@pytest.mark.parametrize(("path", "leaf"), LEAVES, ids=IDS)
def test_a_global_option_works_before_between_and_after_the_command_or_is_refused(path, leaf, name):
    for at in range(len(path) + 2):
        argv = _argv(path, leaf, at, [f"--{name}", GIVEN[name]])
        if _shows(leaf, name):
            args = _args(argv)
            assert getattr(args, name) == EXPECTED[name], argv
        else:
            said = _refused(argv)
            assert f"--{name} has no effect on `delayq {' '.join(path)}`" in said, argv


@pytest.mark.parametrize(("path", "leaf"), LEAVES, ids=IDS)
def test_defaults_when_not_given(path, leaf):
    args = _args([*path, *_minimal_args(leaf)])
    if _shows(leaf, "url"):
        assert args.url is None  # resolved later from $DELAYQ_URL, $RABBITMQ_URL, ...
    else:
        assert not hasattr(args, "url")
    if _shows(leaf, "file"):
        assert args.file == DEFAULT_TOPOLOGY_FILE
    else:
        assert not hasattr(args, "file")


@pytest.mark.parametrize(
    ("path", "leaf"),
    [x for x in LEAVES if _shows(x[1], "url")],
    ids=[i for i, x in zip(IDS, LEAVES, strict=True) if _shows(x[1], "url")],
)
def test_two_different_values_anywhere_are_refused_and_the_same_one_twice_is_fine(path, leaf):
    other = "amqp://u:other-secret@127.0.0.1:1/"
    for at in range(1, len(path) + 2):
        argv = _argv(path, leaf, at, ["--url", other])
        said = _refused(["--url", GIVEN["url"], *argv])
        assert "--url given with different values" in said
        assert "other-secret" not in said and "pw@" not in said  # passwords redacted
        args = _args(["--url", GIVEN["url"], *_argv(path, leaf, at, ["--url", GIVEN["url"]])])
        assert args.url == GIVEN["url"]


def test_any_option_twice_with_different_values_is_refused(capsys):
    said = _refused(["publish", "-k", "a.b", "-d", "1s", "--delay", "2h"])
    assert "given twice with different values ('1s' and '2h')" in said
    said = _refused(["publish", "-k", "a", "-d", "1s", "--url", DEAD_URL, "--url", "amqp://x/"])
    assert "s3cret" not in said
    assert _args(["publish", "-k", "a.b", "-d", "1s", "-d", "1s"]).delay == "1s"
    # through main: exit 2, one error line, the usage above it, nothing run
    assert main(["publish", "-k", "a.b", "-d", "1s", "-d", "2h"]) == EXIT_INPUT
    err = capsys.readouterr().err
    assert err.count("delayq: error:") == 1 and "Usage: delayq publish" in err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (
            ["publish", "-k", "a", "-d", "1s", "--body", "1", "--body-file", "x"],
            "--body-file is not allowed with --body",
        ),
        (["dlq", "replay", "q"], "one of --id or --all is required"),
        (["unrouted", "replay", "--id", "a", "--all"], "--all is not allowed with --id"),
        (
            ["spark", "schedule", "in", "--delay-col", "d", "--due-col", "e"],
            "--due-col is not allowed with --delay-col",
        ),
        (["spark", "schedule", "in"], "one of --delay-col or --due-col is required"),
        (
            [
                "spark",
                "schedule",
                "in",
                "--delay-col",
                "d",
                "--max-rejected",
                "0",
                "--allow-rejected",
            ],
            "--allow-rejected is not allowed with --max-rejected",
        ),
        (["publish", "-d", "1s"], "Missing option '--routing-key'"),
        (["dlq", "list", "q", "--limit", "0"], "0 is not in the range x>=1"),
        (["dlq", "replay", "q", "--all", "--rate", "0"], "--rate"),
        (["dlq", "replay", "q", "--all", "--rate", "inf"], "--rate"),
        (["worker", "app", "--log-format", "xml"], "'xml' is not one of 'text', 'json'"),
        (["publish", "-k", "a", "-d", "1s", "--no-such-option"], "No such option"),
        (["topology", "nope"], "No such command 'nope'"),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, list) else None,
)
def test_refused_lines(argv, says, capsys):
    assert says in _refused(argv)
    assert main(argv) == EXIT_INPUT
    assert says in capsys.readouterr().err


def test_a_given_default_value_still_counts_as_given():
    """`--max-rejected 0` is the default's value, but given: it excludes --allow-rejected."""
    said = _refused(
        ["spark", "schedule", "in", "--delay-col", "d", "--max-rejected", "0", "--allow-rejected"]
    )
    assert "not allowed" in said
    assert _args(["spark", "schedule", "in", "--due-col", "d", "--allow-rejected"]).allow_rejected


def test_repeatable_options_collect_every_value():
    args = _args(["dlq", "replay", "q", "--id", "a", "--id", "b"])
    assert args.ids == ("a", "b") and args.all is False
    args = _args(["dlq", "show", "q", "m1", "--mask-header", "x", "--mask-header", "y"])
    assert args.mask_header == ("x", "y") and args.message_id == "m1"


def test_the_parked_commands_know_their_group():
    assert _args(["dlq", "list", "q"]).command == "dlq"
    assert _args(["unrouted", "purge", "--yes"]).parked_command == "purge"
    with pytest.raises(click.UsageError):
        parse(["unrouted", "list", "q"])  # unrouted takes no queue


def test_url_before_the_command_is_the_broker_used(capsys, monkeypatch):
    """Before the fix, `delayq --url X publish` used $DELAYQ_URL (here: port 2)."""
    monkeypatch.setenv("DELAYQ_URL", "amqp://guest:guest@127.0.0.1:2/")
    argv = ["--url", DEAD_URL, "--file", str(TOPOLOGY)]
    argv += ["publish", "-k", "orders.reminder", "-d", "1m"]  # a key the file binds
    assert main(argv) == EXIT_BROKER
    err = capsys.readouterr().err
    assert "127.0.0.1:1/" in err and "127.0.0.1:2" not in err and "s3cret" not in err


def test_file_before_the_command_is_the_topology_read(tmp_path, capsys):
    """Before the fix, `delayq --file X retry-plan` read topology/delayq.yaml."""
    path = tmp_path / "t.yaml"
    path.write_text("namespace: mine\nladder: [7s, 13s]\ndestinations: []\n")
    assert main(["--file", str(path), "retry-plan", "--initial", "5s", "--max-attempts", "2"]) == 0
    assert "# ladder: 7s 13s" in capsys.readouterr().out


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"delayq {__version__}"


def test_counted_words():
    assert [counted(n, "retry", "retries") for n in (0, 1, 2)] == [
        "0 retries",
        "1 retry",
        "2 retries",
    ]
    assert counted(1, "message") == "1 message"


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["--version"],
        ["topology", "plan", "--file", str(TOPOLOGY)],
        ["topology", "export", "--file", str(TOPOLOGY)],
        ["retry-plan", "--file", str(TOPOLOGY), "--rocketmq"],
    ],
    ids=["help", "version", "plan", "export", "retry-plan"],
)
def test_a_closed_pipe_ends_quietly(argv):
    """`delayq ... | head`: the reader went away; no BrokenPipeError traceback."""
    read, write = os.pipe()
    os.close(read)  # every write fails with EPIPE, as after `head` exits
    try:
        run = subprocess.run(
            [sys.executable, "-m", "delayq", *argv],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write)
    assert run.stderr == ""
    assert run.returncode in (0, 141)


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["topology", "export", "--file", str(TOPOLOGY)], ["scheduled", "--help"]],
    ids=["help", "export", "scheduled-help"],
)
def test_a_full_disk_under_stdout_is_one_line_and_exit_1(argv):
    """`delayq ... > /dev/full`: the write fails with ENOSPC; one line, no traceback."""
    with open("/dev/full", "w") as full:
        run = subprocess.run(
            [sys.executable, "-m", "delayq", *argv],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    assert run.returncode == 1, run.stderr
    assert run.stderr.strip() == "delayq: error: No space left on device (OSError)"


@pytest.mark.parametrize("argv", [[], ["dlq"], ["topology"]], ids=["none", "dlq", "topology"])
def test_a_group_without_its_command_prints_its_help_and_exits_2(argv, capsys):
    assert main(argv) == EXIT_INPUT
    err = capsys.readouterr().err
    assert "Usage: delayq" in err and "Commands:" in err
