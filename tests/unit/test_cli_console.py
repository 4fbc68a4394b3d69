"""What the commands show a person (rich on a terminal) and a program (plain text)."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys

import pytest

from delayq.cli import main
from delayq.cli._console import is_terminal, progress_bar, show_table
from delayq.tables import Column, Table

LONG_ID = "order-" + "7" * 60  # longer than the plain list's 34-character id column


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _table() -> Table:
    table = Table(
        [Column("message id", max_width=34), Column("attempts", right=True), Column("status")],
        before=["source: test"],
        after=["2 shown"],
    )
    table.add(LONG_ID, "3", "FAIL")
    table.add("m-2", "12", "OK")
    return table


def test_plain_text_aligns_columns_and_cuts_only_where_told():
    text = _table().plain()
    lines = text.splitlines()
    assert lines[0] == "# source: test" and lines[-1] == "# 2 shown"
    assert lines[1].split() == ["message", "id", "attempts", "status"]
    assert lines[2].split() == [LONG_ID[:33] + "…", "3", "FAIL"]
    assert lines[3].split() == ["m-2", "12", "OK"]
    # the right-aligned column ends at one place on every line
    assert len({line.index("attempts") + len("attempts") for line in lines[1:2]}) == 1
    assert lines[2].index(" 3 ") + 2 == lines[3].index("12") + 2 == lines[1].index("attempts") + 8
    with pytest.raises(ValueError, match="a row of 2 cells for 3 columns"):
        _table().add("a", "b")


def test_a_pipe_gets_plain_text_and_a_terminal_gets_a_drawn_table(monkeypatch):
    monkeypatch.delenv("TERM", raising=False)
    pipe = io.StringIO()
    show_table(_table(), pipe)
    assert pipe.getvalue() == _table().plain()
    tty = Terminal()
    show_table(_table(), tty)
    drawn = re.sub(r"\x1b\[[0-9;]*m", "", tty.getvalue())  # colours off for reading
    assert drawn != _table().plain() and "─" in drawn  # rich's rule under the header
    # nothing cut on a terminal: the long id is whole (folded onto lines if need be)
    assert "order-" + "7" * 40 in drawn and drawn.count("7") == LONG_ID.count("7")
    assert "…" not in drawn
    assert "# source: test" in drawn and "# 2 shown" in drawn


def test_term_dumb_and_a_closed_stream_are_no_terminal(monkeypatch):
    monkeypatch.setenv("TERM", "dumb")
    assert not is_terminal(Terminal())
    closed = io.StringIO()
    closed.close()
    assert not is_terminal(closed)


def test_progress_off_a_terminal_is_whole_lines_at_most_once_a_second():
    times = iter([0.0, 0.2, 0.4, 1.5, 1.6, 1.7])
    out = io.StringIO()
    with progress_bar("replaying", out, clock=lambda: next(times)) as progress:
        for done in range(1, 6):
            progress(done, 6)
    # 1 (first), 4 (a second later), 5 (the last one, said at the end)
    assert out.getvalue().splitlines() == ["replaying: 1/6", "replaying: 4/6", "replaying: 5/6"]
    out = io.StringIO()
    with progress_bar("replaying", out) as progress:
        progress(3, 3)
    assert out.getvalue() == "replaying: 3/3\n"


def test_progress_on_a_terminal_is_a_bar(monkeypatch):
    monkeypatch.delenv("TERM", raising=False)
    tty = Terminal()
    with progress_bar("replaying", tty) as progress:
        for done in range(1, 4):
            progress(done, 3)
    assert "replaying" in tty.getvalue() and "3/3" in tty.getvalue()


def test_retry_plan_on_a_pipe_is_unchanged_plain_text(capsys):
    assert main(["retry-plan", "--initial", "30s", "--max-attempts", "3"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if not line.startswith("#")]
    assert rows[0] == ["attempt", "requested", "tier", "late", "by", "cumulative"]
    assert rows[1:] == [["2", "30s", "30s", "0s", "30s"], ["3", "1m", "1m", "0s", "1m30s"]]


def test_shell_completion_script_and_answers():
    """`delayq completion bash` prints a script; the script's request completes commands,
    actions and choices."""
    script = subprocess.run(
        [sys.executable, "-m", "delayq", "completion", "bash"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert script.returncode == 0 and "_DELAYQ_COMPLETE" in script.stdout

    def complete(words: str) -> list[str]:
        env = {
            **os.environ,
            "_DELAYQ_COMPLETE": "bash_complete",
            "COMP_WORDS": words,
            "COMP_CWORD": str(len(words.split()) - (0 if words.endswith(" ") else 1)),
        }
        done = subprocess.run(
            [sys.executable, "-m", "delayq"], env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        return [line.split(",", 1)[1] for line in done.stdout.splitlines()]

    assert set(complete("delayq to")) == {"topology"}
    assert {"plan", "apply", "export", "verify", "grant"} <= set(complete("delayq topology "))
    assert set(complete("delayq worker app --log-format ")) == {"text", "json"}
    assert "--routing-key" in complete("delayq publish --rout")
    assert main(["completion", "tcsh"]) == 2
