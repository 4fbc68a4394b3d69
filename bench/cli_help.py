"""Start-up of the command line: ``delayq --help`` beside a bare click app of the same shape.

The anchor is a click app generated for the run with delayq's very tree: the same
groups and commands, each with as many options, and nothing else to import. Both are
started as new processes by the same interpreter, alternately, ``--runs`` times each;
the script prints the median wall and CPU time of each and their ratio (delayq over
the anchor). What is left above 1 is delayq's own start-up: its modules and the help
texts of its options. No test asserts on it.

    PYTHONPATH=src python bench/cli_help.py --runs 20
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click
from benchlib import command_line, load_average, log, positive_int

from delayq.cli import build_cli

DELAYQ = ["-c", "import sys; from delayq.cli import main; sys.exit(main())"]
"""What the installed ``delayq`` script runs."""


def anchor_source(group: click.Group) -> tuple[str, int, int]:
    """A click app of ``group``'s shape (groups, commands, options per command), its
    commands and options counted."""
    lines = ["import click", "", "def run(**_):", "    pass", ""]
    counts = [0, 0]

    def emit(command: click.Command, var: str, parent: str | None) -> None:
        options = [p for p in command.params if isinstance(p, click.Option)]
        counts[1] += len(options)
        decls = ", ".join(
            f"click.Option(['--o{i}'], help={(o.help or '')!r})" for i, o in enumerate(options)
        )
        short = repr(command.get_short_help_str(limit=80))
        if isinstance(command, click.Group):
            lines.append(
                f"{var} = click.Group({command.name!r}, params=[{decls}], short_help={short})"
            )
            for i, sub in enumerate(command.commands.values()):
                emit(sub, f"{var}_{i}", var)
        else:
            counts[0] += 1
            lines.append(
                f"{var} = click.Command({command.name!r}, callback=run, params=[{decls}], "
                f"short_help={short})"
            )
        if parent is not None:
            lines.append(f"{parent}.add_command({var})")

    emit(group, "cli", None)
    lines += ["", "cli.main(prog_name='anchor')"]
    return "\n".join(lines) + "\n", counts[0], counts[1]


def timed(argv: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds (user + system) of one run of ``argv``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=positive_int, default=20, help="runs of each (default 20)")
    args = parser.parse_args()
    source, commands, options = anchor_source(build_cli())
    with tempfile.TemporaryDirectory(prefix="delayq-cli-help-") as tmp:
        anchor = Path(tmp) / "anchor.py"
        anchor.write_text(source)
        argvs = {
            "delayq": [sys.executable, *DELAYQ, "--help"],
            "anchor": [sys.executable, str(anchor), "--help"],
        }
        env_note = os.environ.get("PYTHONPATH", "")
        log(f"{commands} commands, {options} options; PYTHONPATH={env_note!r}; warming up ...")
        for argv in argvs.values():
            timed(argv)  # compiled bytecode and a warm page cache for both
        runs: dict[str, list[tuple[float, float]]] = {name: [] for name in argvs}
        for _ in range(args.runs):
            for name, argv in argvs.items():
                runs[name].append(timed(argv))
    wall = {name: statistics.median(r[0] for r in found) for name, found in runs.items()}
    cpu = {name: statistics.median(r[1] for r in found) for name, found in runs.items()}
    print(f"# {command_line(sys.argv[1:])}; load average {load_average()}")
    print(f"# {commands} commands, {options} options; median of {args.runs} runs each")
    print(f"{'':<28}{'wall ms':>9}{'cpu ms':>9}")
    for name, label in (("delayq", "delayq --help"), ("anchor", "bare click app (anchor)")):
        print(f"{label:<28}{wall[name] * 1000:>9.0f}{cpu[name] * 1000:>9.0f}")
    print(
        f"{'ratio delayq / anchor':<28}{wall['delayq'] / wall['anchor']:>9.2f}"
        f"{cpu['delayq'] / cpu['anchor']:>9.2f}"
    )


if __name__ == "__main__":
    main()
