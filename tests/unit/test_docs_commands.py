"""The output the docs show for ``$ delayq ...`` matches what the command prints.

Every fenced block of README.md and docs/**/*.md is read for lines ``$ delayq ...``; the
lines after one, up to the next ``$`` line or the end of the block, are its standard
output (what goes to stderr is not shown in these blocks). The
commands that need no broker (``NO_BROKER``) run here, from the checkout (so
``topology/delayq.yaml`` is the default topology), and must print what is shown. In the
documented output ``...`` stands for any text in a line (the blank before it included),
and a line of only ``...`` (after a ``#`` prefix, if any) for one or more lines (with
that prefix).
"""

from __future__ import annotations

import difflib
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = (ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")))
NO_BROKER = (("retry-plan",), ("topology", "plan"), ("topology", "grant"))
"""Commands that print without a broker (``topology grant`` without ``--apply``)."""
UNREACHABLE = "amqp://guest:guest@127.0.0.1:1/"


@dataclass(frozen=True)
class Shown:
    where: str
    argv: tuple[str, ...]
    output: tuple[str, ...]


def _blocks(text: str) -> list[tuple[int, list[str]]]:
    blocks, lines, start = [], text.splitlines(), None
    for number, line in enumerate(lines, 1):
        if re.match(r"^\s*(```|~~~)", line):
            if start is None:
                start = number
            else:
                blocks.append((start, lines[start : number - 1]))
                start = None
    return blocks


def shown_commands() -> list[Shown]:
    found = []
    for doc in DOCUMENTS:
        for start, block in _blocks(doc.read_text(encoding="utf-8")):
            i = 0
            while i < len(block):
                if not block[i].startswith("$ delayq "):
                    i += 1
                    continue
                line_no, command = start + i + 1, block[i][2:]
                while command.endswith("\\") and i + 1 < len(block):
                    i += 1
                    command = command[:-1] + " " + block[i].strip()
                i += 1
                output = []
                while i < len(block) and not block[i].startswith("$ "):
                    output.append(block[i].rstrip())
                    i += 1
                where = f"{doc.relative_to(ROOT)}:{line_no}"
                found.append(Shown(where, tuple(shlex.split(command))[1:], tuple(output)))
    return found


def _needs_no_broker(shown: Shown) -> bool:
    words = tuple(w for w in shown.argv if not w.startswith("-"))
    return (
        any(words[: len(c)] == c for c in NO_BROKER)
        and "--apply" not in shown.argv
        and not {"|", ">", "&&", ";"} & set(shown.argv)
    )


def matches(documented: tuple[str, ...], printed: list[str]) -> bool:
    pattern = []
    for line in documented:
        if "..." in line and not line.replace("...", "").strip(" #"):
            prefix = line[: line.index("...")]
            pattern.append(f"(?:{re.escape(prefix)}.*\\n)+")
        else:
            pieces = [p.rstrip() for p in line.split("...")[:-1]] + [line.split("...")[-1]]
            pattern.append(".*".join(re.escape(p) for p in pieces) + "\\n")
    text = "".join(line.rstrip() + "\n" for line in printed)
    return re.fullmatch("".join(pattern), text) is not None


def test_the_documented_commands_are_found() -> None:
    checked = {" ".join(s.argv[:2]) for s in shown_commands() if _needs_no_broker(s)}
    assert {"retry-plan --initial", "topology grant"} <= checked, checked


def test_the_matching_reads_ellipses() -> None:
    printed = ["# head", "#   a: one", "#   b: two", "x 'long value' y"]
    assert matches(("# head", "#   ...", "x 'long ... y"), printed)
    assert matches(("# head", "...", "x ..."), printed)
    assert not matches(("# head", "#   a: one", "x ..."), printed)
    assert not matches(("# head",), printed)


@pytest.mark.parametrize(
    "shown", [s for s in shown_commands() if _needs_no_broker(s)], ids=lambda s: s.where
)
def test_the_documented_output_is_what_the_command_prints(shown: Shown) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DELAYQ_", "RABBITMQ_"))}
    env.pop("COLUMNS", None)
    env.update(DELAYQ_URL=UNREACHABLE, NO_COLOR="1")
    done = subprocess.run(
        [sys.executable, "-m", "delayq", *shown.argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    printed = done.stdout.splitlines()
    if not matches(shown.output, printed):
        diff = "\n".join(
            difflib.unified_diff(list(shown.output), printed, "documented", "printed", lineterm="")
        )
        pytest.fail(
            f"{shown.where}: `delayq {' '.join(shown.argv)}`\n{diff}\nstderr: {done.stderr}",
            pytrace=False,
        )
