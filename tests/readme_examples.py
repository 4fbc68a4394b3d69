"""The ```python blocks of README.md and docs/**/*.md, read and run as a reader would run them.

Every block runs, as its own program in a scratch folder holding a copy of
``topology/``, so a broken example fails the suite (``tests/unit/test_readme_examples.py``
for blocks that need no server, ``tests/integration/test_readme_examples.py`` for the
others). A block may be preceded by an HTML comment that tells the test about it
(several directives in one comment are separated by ``;``)::

    <!-- test: skip (REASON) -->       never run; the reason is required
    <!-- test: continues previous -->  run after the previous python block of the file
    <!-- test: runs until stopped -->  serves until SIGTERM: the test waits until it
                                       consumes, then stops it and wants exit 0
    <!-- test: needs broker -->        needs a broker though it names no URL (e.g. it
                                       reads $DELAYQ_URL); also: management, redis,
                                       postgres, spark, cluster, node

Most needs are read from the block itself: the README's placeholder addresses
(``PLACEHOLDERS``) are replaced with throwaway servers' addresses, and a block that
starts a ``LocalNode``, a ``LocalCluster`` or imports ``delayq.spark`` needs that.
A block whose top-level functions are named ``test_*`` is a test file: it runs
under pytest and all its tests must pass.
"""

from __future__ import annotations

import ast
import contextlib
import io
import os
import re
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import delayq

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = (ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")))

AMQP = "amqp://guest:guest@localhost:5672/"
MANAGEMENT = "http://guest:guest@localhost:15672/"
REDIS = "redis://:secret@redis:6379/0"
POSTGRES = "postgresql://app:secret@db:5432/app"
PLACEHOLDERS = {AMQP: "broker", MANAGEMENT: "management", REDIS: "redis", POSTGRES: "postgres"}
"""README addresses the test replaces with a throwaway server's, and the need each implies."""

NEEDS = frozenset({"broker", "management", "redis", "postgres", "spark", "cluster", "node"})
UNREACHABLE = "amqp://guest:guest@127.0.0.1:1/"
"""$DELAYQ_URL of blocks that need no broker: a use the test did not see fails fast."""

_FENCE = re.compile(r"^```(\S*)\s*$")
_MARKER = re.compile(r"^<!--\s*test:(.*?)-->\s*$")
_SKIP = re.compile(r"^skip\s*\((.*)\)$")


class MarkerError(ValueError):
    """A ``<!-- test: ... -->`` comment the test cannot accept."""


@dataclass(frozen=True)
class Block:
    """One ```python block and what its markers say about it."""

    path: Path
    line: int
    """Line of the opening fence (1-based)."""
    source: str
    skip: str | None = None
    continues: Block | None = None
    until_stopped: bool = False
    declared: frozenset[str] = frozenset()

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def program(self) -> str:
        """The source that runs: the blocks it continues, then its own."""
        head = self.continues.program + "\n" if self.continues is not None else ""
        return head + self.source

    @property
    def needs(self) -> frozenset[str]:
        found = {need for address, need in PLACEHOLDERS.items() if address in self.source}
        if "LocalNode(" in self.source:
            found.add("node")
        if "LocalCluster(" in self.source:
            found.add("cluster")
        if "delayq.spark" in self.source:
            found.add("spark")
        if found & {"management", "spark"} or self.until_stopped:
            found.add("broker")  # served by a vhost of the management node
        inherited = self.continues.needs if self.continues is not None else frozenset()
        return frozenset(found) | self.declared | inherited

    @property
    def test_functions(self) -> list[str]:
        tree = ast.parse(self.source)
        return [
            node.name
            for node in tree.body
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.name.startswith("test_")
        ]


def _directives(comment: str, where: str) -> list[str]:
    parts = [part.strip() for part in re.split(r";(?![^()]*\))", comment)]  # not in (...)
    if not all(parts):
        raise MarkerError(f"{where}: empty directive in <!-- test:{comment}-->")
    return parts


def parse(path: Path) -> list[Block]:
    """The python blocks of ``path``; raises :class:`MarkerError` on a bad marker."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    pending: tuple[int, list[str]] | None = None  # a marker waiting for its block
    index = 0
    while index < len(lines):
        line = lines[index]
        marker = _MARKER.match(line.strip())
        fence = _FENCE.match(line)
        where = f"{path.relative_to(ROOT)}:{index + 1}"
        if marker:
            if pending is not None:
                raise MarkerError(f"{where}: two test markers in a row (put both in one)")
            pending = (index + 1, _directives(marker.group(1), where))
        elif fence:
            language = fence.group(1)
            end = index + 1
            while end < len(lines) and not lines[end].startswith("```"):
                end += 1
            if language == "python":
                body = "\n".join(lines[index + 1 : end]) + "\n"
                marked, directives = pending if pending is not None else (index + 1, [])
                blocks.append(_block(path, index + 1, body, directives, marked, blocks))
            elif pending is not None:
                raise MarkerError(
                    f"{path.relative_to(ROOT)}:{pending[0]}: a test marker before a "
                    f"```{language} block: markers go right before ```python blocks"
                )
            pending = None
            index = end
        elif line.strip() and pending is not None:
            raise MarkerError(
                f"{path.relative_to(ROOT)}:{pending[0]}: a test marker must come right "
                "before its ```python block (blank lines only in between)"
            )
        index += 1
    if pending is not None:
        raise MarkerError(f"{path.relative_to(ROOT)}:{pending[0]}: a test marker with no block")
    return blocks


def _block(
    path: Path, line: int, source: str, directives: list[str], marked: int, before: list[Block]
) -> Block:
    where = f"{path.relative_to(ROOT)}:{marked}"  # errors point at the marker
    skip: str | None = None
    continues: Block | None = None
    until_stopped = False
    declared: set[str] = set()
    for directive in directives:
        skipped = _SKIP.match(directive)
        if skipped:
            reason = skipped.group(1).strip()
            if not reason:
                raise MarkerError(f"{where}: `skip ()` needs a reason: skip (why it cannot run)")
            skip = reason
        elif directive == "skip" or directive.startswith("skip "):
            raise MarkerError(f"{where}: `{directive}`: write skip (the reason it cannot run)")
        elif directive == "continues previous":
            if not before:
                raise MarkerError(f"{where}: `continues previous` on the file's first block")
            continues = before[-1]
        elif directive == "runs until stopped":
            until_stopped = True
        elif directive.startswith("needs "):
            wanted = {w.strip() for w in directive.removeprefix("needs ").split(",")}
            unknown = wanted - NEEDS
            if unknown or not all(wanted):
                raise MarkerError(
                    f"{where}: `{directive}`: unknown need {sorted(unknown)}; "
                    f"known: {', '.join(sorted(NEEDS))}"
                )
            declared |= wanted
        else:
            raise MarkerError(
                f"{where}: unknown test directive `{directive}`; known: skip (reason), "
                "continues previous, runs until stopped, needs ..."
            )
    if skip is not None and len(directives) > 1:
        raise MarkerError(f"{where}: a skipped block takes no other directive")
    return Block(path, line, source, skip, continues, until_stopped, frozenset(declared))


def all_blocks() -> list[Block]:
    return [block for path in DOCUMENTS for block in parse(path)]


def runnable(*, server: bool) -> list[Block]:
    """Blocks that run: those needing a server (``server=True``) or none.

    A bad marker raises here, at collection, naming its line."""
    return [b for b in all_blocks() if b.skip is None and bool(b.needs) == server]


def block_id(block: Block) -> str:
    return f"{block.path.name}:{block.line}"


def prepare(block: Block, folder: Path, vhost: str = "/") -> None:
    """A scratch folder as a reader's checkout: ``topology/`` (for ``vhost``)."""
    (folder / "topology").mkdir(parents=True, exist_ok=True)
    for source in (ROOT / "topology").iterdir():
        text = source.read_text(encoding="utf-8")
        if source.suffix == ".yaml":
            text = re.sub(r"(?m)^vhost: /\s.*$", f"vhost: {vhost}", text)
        (folder / "topology" / source.name).write_text(text, encoding="utf-8")


def environment(urls: Mapping[str, str]) -> dict[str, str]:
    """The block's environment: the delayq under test, broker URLs, no stray proxies."""
    source = str(Path(delayq.__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (source, os.environ.get("PYTHONPATH", "")) if p)
    broker = urls.get(AMQP, UNREACHABLE)
    env = {**os.environ, "PYTHONPATH": path, "DELAYQ_URL": broker, "RABBITMQ_URL": broker}
    env.pop("DELAYQ_MANAGEMENT_URL", None)
    if MANAGEMENT in urls:
        env["DELAYQ_MANAGEMENT_URL"] = urls[MANAGEMENT]
    return env


def substitute(program: str, urls: Mapping[str, str]) -> str:
    for placeholder, real in urls.items():
        program = program.replace(placeholder, real)
    return program


def _numbered(block: Block) -> str:
    first = block.line + 1
    own = block.source.rstrip("\n").splitlines()
    return "\n".join(f"{first + n:5d} | {text}" for n, text in enumerate(own))


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def failure(block: Block, what: str, stdout: str, stderr: str) -> str:
    """A failure message that says which block, what went wrong and its output."""
    return (
        f"{block.where}: the README's python block {what}\n"
        f"--- stderr (last lines) ---\n{_tail(stderr)}\n"
        f"--- stdout (last lines) ---\n{_tail(stdout, 15)}\n"
        f"--- the block ({block.where}) ---\n{_numbered(block)}"
    )


def run(
    block: Block,
    folder: Path,
    urls: Mapping[str, str],
    *,
    timeout_s: float = 120.0,
    consuming: Callable[[], bool] | None = None,
) -> str | None:
    """Run ``block`` in ``folder``; return a failure message, or None when it ran well.

    A test file runs under pytest; a block that runs until stopped is sent SIGTERM
    once ``consuming()`` says it consumes, and must then exit 0.
    """
    program = substitute(block.program, urls)
    env = environment(urls)
    tests = block.test_functions
    if tests:
        script = folder / f"test_readme_{block.line}.py"
        script.write_text(program, encoding="utf-8")
        command = [sys.executable, "-m", "pytest", script.name, "-q", "-p", "no:cacheprovider"]
    else:
        script = folder / f"readme_{block.line}.py"
        script.write_text(program, encoding="utf-8")
        command = [sys.executable, script.name]
    process = subprocess.Popen(
        command, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    if block.until_stopped:
        return _stop_when_consuming(block, process, consuming, timeout_s)
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
        return failure(
            block,
            f"did not finish in {timeout_s:.0f} s (if it serves until stopped, put "
            "<!-- test: runs until stopped --> before it)",
            stdout,
            stderr,
        )
    if process.returncode != 0:
        return failure(block, f"exited with {process.returncode}", stdout, stderr)
    if tests and f"{len(tests)} passed" not in stdout:
        return failure(block, f"is a test file of {len(tests)} tests: not all passed", stdout, "")
    return None


def in_session(block: Block) -> bool:
    """Whether ``block`` runs in the test process's Spark session (:func:`run_in_session`)
    rather than as a program of its own: a Spark block that is neither a test file nor
    a server, whose only Spark use is ``local_session()``'s (the active session), and
    that sets no global OpenTelemetry tracer provider (it is set once per process: every
    later test of the worker would then be traced)."""
    return (
        "spark" in block.needs
        and not block.until_stopped
        and not block.test_functions
        and "set_tracer_provider" not in block.source
    )


def run_in_session(block: Block, folder: Path, urls: Mapping[str, str], spark: Any) -> str | None:
    """Run ``block`` in this process, in ``spark`` (the Spark worker's session): return a
    failure message, or None when it ran well.

    A Spark block as its own program spends most of its time starting a JVM and warming
    it up (about 10 s of a 15 s block on a quiet machine, a minute under load); here its
    ``local_session()`` returns the running session (the active one), and the rest is
    what a reader's program sees: ``__name__ == "__main__"``, ``folder`` as the current
    directory for Python and for the JVM (Hadoop's working directory, which relative
    Spark paths such as ``errors_path="out/rejected"`` resolve against), the block's
    environment, its own stdout and stderr. A block that raises, or exits non-zero,
    fails with its traceback and output. ``stop()`` on the session or its context does
    nothing while it runs (the session is shared; a reader's program may stop its own),
    and streaming queries it leaves running are stopped after it.
    """
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    script = folder / f"readme_{block.line}.py"
    program = substitute(block.program, urls)
    script.write_text(program, encoding="utf-8")
    stdout, stderr = io.StringIO(), io.StringIO()
    outcome: str | None = None
    with contextlib.ExitStack() as stack:
        stack.enter_context(
            _environment(environment(urls), ("DELAYQ_URL", "RABBITMQ_URL", "DELAYQ_MANAGEMENT_URL"))
        )
        stack.enter_context(_cwd(folder))
        stack.enter_context(_jvm_working_directory(spark, folder))
        stack.enter_context(_not_stopped(SparkSession, SparkContext))
        stack.callback(_stop_streams, spark)
        stack.enter_context(contextlib.redirect_stdout(stdout))
        stack.enter_context(contextlib.redirect_stderr(stderr))
        try:
            exec(compile(program, str(script), "exec"), {"__name__": "__main__"})
        except SystemExit as stop:
            if stop.code not in (0, None):
                outcome = f"exited with {stop.code}"
        except Exception:  # the block's own failure, reported with its line
            stderr.write(traceback.format_exc())
            outcome = "raised an exception"
    if outcome is not None:
        return failure(block, outcome, stdout.getvalue(), stderr.getvalue())
    return None


@contextlib.contextmanager
def _environment(env: Mapping[str, str], names: tuple[str, ...]) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in names}
    try:
        for name in names:
            if name in env:
                os.environ[name] = env[name]
            else:
                os.environ.pop(name, None)
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def _cwd(folder: Path) -> Iterator[None]:  # contextlib.chdir from Python 3.11
    before = Path.cwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


@contextlib.contextmanager
def _jvm_working_directory(spark: Any, folder: Path) -> Iterator[None]:
    """Relative paths in the JVM: Hadoop's file systems resolve them against a working
    directory, the JVM's at start. Spark's readers and writers use the one cached local
    ``FileSystem``, whose directory is set here; a ``FileContext`` (a stream's
    checkpoint) takes ``user.dir`` when it is made."""
    jvm, conf = spark.sparkContext._jvm, spark.sparkContext._jsc.hadoopConfiguration()
    local = jvm.org.apache.hadoop.fs.FileSystem.getLocal(conf)
    system = jvm.java.lang.System
    before, user_dir = local.getWorkingDirectory(), system.getProperty("user.dir")
    local.setWorkingDirectory(jvm.org.apache.hadoop.fs.Path(str(folder.resolve())))
    system.setProperty("user.dir", str(folder.resolve()))
    try:
        yield
    finally:
        system.setProperty("user.dir", user_dir)
        local.setWorkingDirectory(before)


@contextlib.contextmanager
def _not_stopped(*classes: type) -> Iterator[None]:
    saved = [(cls, cls.__dict__["stop"]) for cls in classes]
    try:
        for cls, _ in saved:
            setattr(cls, "stop", lambda self: None)  # noqa: B010
        yield
    finally:
        for cls, stop in saved:
            setattr(cls, "stop", stop)  # noqa: B010


def _stop_streams(spark: Any) -> None:
    for query in spark.streams.active:
        query.stop()


def _stop_when_consuming(
    block: Block,
    process: subprocess.Popen[str],
    consuming: Callable[[], bool] | None,
    timeout_s: float,
) -> str | None:
    if consuming is None:
        process.kill()
        process.communicate()
        return f"{block.where}: `runs until stopped` needs a broker to watch"
    deadline = time.monotonic() + timeout_s
    while not consuming():
        if process.poll() is not None or time.monotonic() > deadline:
            if process.poll() is None:
                process.kill()
            stdout, stderr = process.communicate()
            what = (
                f"exited with {process.returncode} before it consumed"
                if process.returncode not in (None, -signal.SIGKILL)
                else f"did not start consuming in {timeout_s:.0f} s"
            )
            return failure(block, what, stdout, stderr)
        time.sleep(0.2)
    process.send_signal(signal.SIGTERM)  # the documented graceful stop
    try:
        stdout, stderr = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
        return failure(block, "did not stop within 60 s of SIGTERM", stdout, stderr)
    if process.returncode != 0:
        return failure(block, f"exited with {process.returncode} after SIGTERM", stdout, stderr)
    return None
