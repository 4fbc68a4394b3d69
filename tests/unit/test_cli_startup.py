"""The command line's start: what ``delayq --help`` loads, and a Ctrl-C while it loads
(issue 48, items 3 and 6). Structural: no timing is asserted (bench/cli_help.py
measures it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import click
import pytest

from delayq.cli import build_cli
from delayq.cli.options import Command, resolve

CONSOLE_SCRIPT = "import sys; from delayq.cli import main; sys.exit(main())"
"""What the installed ``delayq`` script runs."""

HEAVY = ("pika", "aio_pika", "aiormq", "pydantic", "asyncio", "ssl", "sqlite3", "yaml", "rich")


@pytest.mark.parametrize(
    "argv", [["--help"], ["dlq", "--help"], ["spark", "schedule", "--help"], ["publish", "-h"]]
)
def test_help_loads_no_client_no_model_no_asyncio_ssl_or_sqlite(argv: list[str]) -> None:
    code = textwrap.dedent(
        f"""
        import contextlib, io, json, sys
        from delayq.cli import main
        with contextlib.redirect_stdout(io.StringIO()):
            code = main({argv!r})
        loaded = [m for m in sys.modules if m.split(".")[0] in {HEAVY!r}]
        models = [m for m in sys.modules if m.startswith("delayq.") and "model" in m]
        print(json.dumps({{"code": code, "loaded": loaded, "models": models}}))
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found == {"code": 0, "loaded": [], "models": []}


def test_the_check_above_sees_what_a_command_loads() -> None:
    """Not vacuous: running a command (not its help) loads pydantic and yaml."""
    code = (
        "import sys; from delayq.cli import main; main(['topology', 'plan', '-f', '/nonexistent']);"
        "assert 'pydantic' in sys.modules and 'yaml' in sys.modules"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def _commands(group: click.Group) -> list[click.Command]:
    found: list[click.Command] = []
    for command in group.commands.values():
        found += _commands(command) if isinstance(command, click.Group) else [command]
    return found


def test_importing_delayq_cli_imports_nothing_more() -> None:
    """What the ``delayq`` script imports before main() can catch a Ctrl-C: nothing."""
    code = (
        "import sys; before = set(sys.modules); import delayq.cli; "
        "print(sorted(set(sys.modules) - before))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "['delayq', 'delayq.cli']", done.stderr


def test_every_command_names_a_handler_that_imports() -> None:
    """Handlers are named ``"module:function"`` and imported to run: a wrong name would
    only show when the command runs."""
    commands = [c for c in _commands(build_cli()) if isinstance(c, Command)]
    assert len(commands) > 20
    for command in commands:
        assert command.handler is not None, command.name
        assert callable(resolve(command.handler)), command.name


INTERRUPT_HOOK = textwrap.dedent(
    """
    import os, signal, sys

    class InterruptAt:
        '''Sends this process SIGINT as Python starts importing one module: the
        KeyboardInterrupt rises from that import, wherever it stands.'''

        def find_spec(self, name, path=None, target=None):
            if name == os.environ.get("DELAYQ_TEST_SIGINT_AT"):
                sys.meta_path.remove(self)
                os.kill(os.getpid(), signal.SIGINT)
            return None

    sys.meta_path.insert(0, InterruptAt())
    """
)


@pytest.mark.parametrize(
    ("module", "argv"),
    [
        # the first import of all: delayq and delayq.cli import nothing before main() runs
        ("__future__", ["--help"]),
        ("delayq.cli._main", ["--help"]),
        ("click", ["--help"]),
        ("delayq.cli.app", ["--help"]),
        ("delayq.cli.options", ["--version"]),
        ("delayq.cli.run", ["retry-plan", "-f", "/nonexistent.yaml"]),
        ("pydantic", ["topology", "plan", "-f", "/nonexistent.yaml"]),
    ],
)
def test_ctrl_c_while_loading_ends_in_one_line_and_130(
    module: str, argv: list[str], tmp_path: Path
) -> None:
    (tmp_path / "sitecustomize.py").write_text(INTERRUPT_HOOK)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path]),
        "DELAYQ_TEST_SIGINT_AT": module,
    }
    done = subprocess.run(
        [sys.executable, "-c", CONSOLE_SCRIPT, *argv], capture_output=True, text=True, env=env
    )
    assert (done.returncode, done.stderr) == (130, "delayq: interrupted\n"), done.stderr


def test_the_start_up_bench_runs_as_documented() -> None:
    """``bench/cli_help.py`` (docs/project/performance.md) prints both figures and their
    ratio; the figures themselves are the script's to measure, never asserted."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "bench/cli_help.py", "--runs", "2"],
        cwd=root, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "delayq --help" in done.stdout and "ratio" in done.stdout.lower(), done.stdout
