"""`--url` and `--file` work wherever the help shows them, or are refused (issue 12, item 6).

The command tree is walked from the parser itself, so a new command or action is
covered without touching this file.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from delayq import __version__
from delayq.cli import EXIT_BROKER, build_parser, main
from delayq.topology.model import DEFAULT_TOPOLOGY_FILE
from delayq.wording import counted

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGY = ROOT / "topology" / "delayq.yaml"
DEAD_URL = "amqp://guest:s3cret@127.0.0.1:1/"
GIVEN = {"url": "amqp://u:pw@elsewhere:5673/", "file": "other/topology.yaml"}
EXPECTED = {"url": GIVEN["url"], "file": Path(GIVEN["file"])}


def _leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
        return
    for name, sub in subs[0].choices.items():
        yield from _leaves(sub, (*path, name))


def _sample(action: argparse.Action) -> str:
    if action.choices:
        return str(next(iter(action.choices)))
    return "1"  # a valid int, float, positive count, path or name alike


def _minimal_args(leaf: argparse.ArgumentParser) -> list[str]:
    """The leaf's positionals, required options and one member of each required group."""
    argv: list[str] = []
    grouped: set[int] = set()
    for group in leaf._mutually_exclusive_groups:
        grouped.update(id(a) for a in group._group_actions)
        if group.required:
            first = group._group_actions[0]
            argv += [first.option_strings[0], *([] if first.nargs == 0 else [_sample(first)])]
    for action in leaf._actions:
        if id(action) in grouped:
            continue
        if not action.option_strings:
            argv.append(_sample(action))
        elif action.required:
            argv += [action.option_strings[0], _sample(action)]
    return argv


LEAVES = sorted(_leaves(build_parser()), key=lambda item: item[0])
IDS = [" ".join(path) for path, _ in LEAVES]


def _shows(leaf: argparse.ArgumentParser, name: str) -> bool:
    return f"--{name} " in leaf.format_help()


def _argv(path: tuple[str, ...], leaf, at: int, option: list[str]) -> list[str]:
    """``option`` inserted after ``at`` command words (``at == len(path) + 1``: at the end)."""
    words, rest = list(path), _minimal_args(leaf)
    if at <= len(path):
        return [*words[:at], *option, *words[at:], *rest]
    return [*words, *rest, *option]


def test_the_walk_finds_every_command_path():
    found = set(IDS)
    assert {"publish", "stats", "worker", "demo", "retry-plan"} <= found
    assert {"topology plan", "topology apply", "topology verify", "topology grant"} <= found
    assert {
        f"{p} {a}" for p in ("dlq", "unrouted") for a in ("list", "show", "replay", "purge")
    } <= found
    assert {"spark schedule", "spark report"} <= found


@pytest.mark.parametrize("name", ["url", "file"])
@pytest.mark.parametrize(("path", "leaf"), LEAVES, ids=IDS)
def test_a_global_option_works_before_between_and_after_the_command_or_is_refused(
    path, leaf, name, capsys
):
    parser = build_parser()
    for at in range(len(path) + 2):
        argv = _argv(path, leaf, at, [f"--{name}", GIVEN[name]])
        if _shows(leaf, name):
            args = parser.parse_args(argv)
            assert getattr(args, name) == EXPECTED[name], argv
            assert not [k for k in vars(args) if "@" in k or k.startswith("_")]
        else:
            with pytest.raises(SystemExit) as exit_:
                parser.parse_args(argv)
            assert exit_.value.code == 2, argv
            assert f"--{name} has no effect on `delayq {' '.join(path)}`" in capsys.readouterr().err


@pytest.mark.parametrize(("path", "leaf"), LEAVES, ids=IDS)
def test_defaults_when_not_given(path, leaf):
    args = build_parser().parse_args([*path, *_minimal_args(leaf)])
    if _shows(leaf, "url"):
        assert args.url is None  # resolved later from $DELAYQ_URL, $RABBITMQ_URL, ...
    if _shows(leaf, "file"):
        assert args.file == DEFAULT_TOPOLOGY_FILE


@pytest.mark.parametrize(
    ("path", "leaf"),
    [x for x in LEAVES if _shows(x[1], "url")],
    ids=[i for i, x in zip(IDS, LEAVES, strict=True) if _shows(x[1], "url")],
)
def test_two_different_values_anywhere_are_refused_and_the_same_one_twice_is_fine(
    path, leaf, capsys
):
    parser = build_parser()
    other = "amqp://u:other-secret@127.0.0.1:1/"
    for at in range(1, len(path) + 2):
        argv = _argv(path, leaf, at, ["--url", other])
        with pytest.raises(SystemExit) as exit_:
            parser.parse_args(["--url", GIVEN["url"], *argv])
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert "--url given with different values" in err
        assert "other-secret" not in err and "pw@" not in err  # passwords redacted
        args = parser.parse_args(
            ["--url", GIVEN["url"], *_argv(path, leaf, at, ["--url", GIVEN["url"]])]
        )
        assert args.url == GIVEN["url"]


def test_any_option_twice_with_different_values_is_refused(capsys):
    parser = build_parser()
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["publish", "-k", "a.b", "-d", "1s", "--delay", "2h"])
    assert exit_.value.code == 2
    assert "given twice with different values ('1s' and '2h')" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parser.parse_args(
            ["publish", "-k", "a", "-d", "1s", "--url", DEAD_URL, "--url", "amqp://x/"]
        )
    assert "s3cret" not in capsys.readouterr().err
    args = parser.parse_args(["publish", "-k", "a.b", "-d", "1s", "-d", "1s"])
    assert args.delay == "1s"


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
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
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
