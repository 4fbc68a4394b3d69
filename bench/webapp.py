"""A web app that publishes one delayed message per request, beside the same app that
answers at once and the same app that waits as long without publishing, and beside
``publish_many``, in one run against one broker.

The apps are ``bench/webapp_apps.py``: a FastAPI app served by uvicorn (on uvloop, its
default with ``uvicorn[standard]``, and on asyncio's loop) with one ``AsyncPublisher``
opened in its lifespan, and a Flask app served by gunicorn's threaded worker (100
threads) sharing one ``Publisher``. Each publishing route answers only once the broker
confirmed its message. Each app runs in three modes: ``none`` (answers at once),
``wait`` (sleeps ``--wait-ms`` first, the yardstick: what holding a request that long
costs the app, whatever it waits for) and ``publish``; and under each ``--gc`` setting:
CPython's default, and ``freeze`` (``gc.freeze()`` once the app has started, as
docs/guides/web-apps.md suggests). A load generator (``wrk``, 100 connections, one
thread) drives each for ``--seconds`` after a warm-up; rounds alternate the order. With
two CPUs or more the app runs on the first and wrk and a local broker on the others
(``--no-pin``: anywhere), as if the broker were another host's: otherwise they take the
app's CPU in the publishing mode only. Printed per server and setting: the rate
(requests/s), p50 and p99 latency, the server's CPU a request of each mode and how much
of it was garbage collection (medians of the rounds), and publish's ratios to none and
to wait (the median of each round's); then ``AsyncPublisher.publish_many`` of the same
messages. Every publishing run checks that the tier holds at least as many messages as
requests were answered (each answered request is a confirmed message), and no more than
those plus the requests in flight when the load stopped.

    .venv/bin/python bench/webapp.py --rounds 3 --seconds 6

Goals (issue 50): the ASGI app at 0.8 or more of its rate with no publish and its p99 at
most twice; the WSGI app at 0.7 or more. A p99 from runs shorter than the documented
ones is noise (one hiccup of the machine is 1 % of a few thousand requests). A run in
which any request failed (a non-2xx answer, a wrk timeout) makes the bench exit 1:
its figures would not measure what they say. SIGTERM stops it as Ctrl-C does.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from benchlib import (
    broker,
    broker_version,
    command_line,
    load_average,
    log,
    positive_int,
    queue_depth,
)

from delayq import Message, Topology
from delayq.aio import AsyncPublisher
from delayq.errors import DelayqError
from delayq.sync import apply_topology, delete_topology

HERE = Path(__file__).resolve().parent
CONNECTIONS = 100
SERVERS = ("asgi", "asgi-asyncio", "wsgi")
MODES = ("none", "wait", "publish")
GCS = ("default", "freeze")
PATH = "/orders/42/reminder"
POST_SCRIPT = (
    'wrk.method = "POST"\nwrk.body = "{}"\nwrk.headers["Content-Type"] = "application/json"\n'
)


@dataclass
class Run:
    rate: float
    p50_ms: float
    p99_ms: float
    answered: int
    failed: int
    cpu_us: float
    gc_us: float
    """Of ``cpu_us``, the time in CPython's garbage collector (the app's ``GET /gc``)."""


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--url", help="the broker (else $RABBITMQ_URL, else a local node)")
    parser.add_argument("--rounds", type=positive_int, default=3)
    parser.add_argument("--seconds", type=positive_int, default=10, help="load a run")
    parser.add_argument("--warmup", type=positive_int, default=2, help="seconds before each")
    parser.add_argument(
        "--servers", default=",".join(SERVERS), help=f"comma-separated, of {', '.join(SERVERS)}"
    )
    parser.add_argument("--many-count", type=positive_int, default=20_000)
    parser.add_argument("--wait-ms", type=positive_int, default=5, help="the wait mode's sleep")
    parser.add_argument("--gc", default=",".join(GCS), help=f"comma-separated, of {', '.join(GCS)}")
    parser.add_argument(
        "--no-pin",
        dest="pin",
        action="store_false",
        help="leave the app, wrk and a local broker on every CPU (default: the app on the "
        "first, the others on the rest, as with the broker on another host)",
    )
    args = parser.parse_args(argv)
    for option, known in (("servers", SERVERS), ("gc", GCS)):
        given = [v for v in getattr(args, option).split(",") if v]
        unknown = set(given) - set(known)
        if unknown or not given:
            parser.error(f"--{option}: unknown {sorted(unknown)}; use some of {', '.join(known)}")
        twice = sorted({v for v in given if given.count(v) > 1})
        if twice:
            parser.error(f"--{option} names {', '.join(twice)} twice: give each once")
        setattr(args, option, given)
    return args


@dataclass(frozen=True)
class Cpus:
    """Where each process runs: the app on its own CPU, the load generator and a local
    broker on the others (``None``: anywhere). On one machine they otherwise take CPU
    from the app in the publishing mode only, and the ratio would measure the machine."""

    app: set[int] | None = None
    rest: set[int] | None = None

    @classmethod
    def choose(cls, pin: bool) -> Cpus:
        cpus = sorted(os.sched_getaffinity(0))
        if not pin or len(cpus) < 2:
            return cls()
        return cls({cpus[0]}, set(cpus[1:]))

    def run_app(self) -> None:
        if self.app is not None:
            os.sched_setaffinity(0, self.app)

    def run_rest(self) -> None:
        if self.rest is not None:
            os.sched_setaffinity(0, self.rest)

    def move_node(self, node: object) -> int:
        """Every thread of a local node's processes to the other CPUs; how many."""
        name = getattr(node, "name", None)
        if self.rest is None or not name:
            return 0
        moved = 0
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            with contextlib.suppress(OSError):
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                if f"RABBITMQ_NODENAME={name}".encode() not in environ:
                    continue
                for task in os.listdir(f"/proc/{pid}/task"):
                    with contextlib.suppress(OSError):
                        os.sched_setaffinity(int(task), self.rest)
                        moved += 1
        return moved


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_command(server: str, port: int) -> list[str]:
    if server.startswith("asgi"):
        loop = "asyncio" if server == "asgi-asyncio" else "uvloop"
        return [
            sys.executable, "-m", "uvicorn", "webapp_apps:asgi_app", "--app-dir", str(HERE),
            "--host", "127.0.0.1", "--port", str(port), "--loop", loop,
            "--no-access-log", "--log-level", "warning",
        ]  # fmt: skip
    return [
        sys.executable, "-m", "gunicorn", "--chdir", str(HERE), "-w", "1", "-k", "gthread",
        "--threads", str(CONNECTIONS), "-b", f"127.0.0.1:{port}", "--log-level", "warning",
        "webapp_apps:wsgi_app",
    ]  # fmt: skip


def answered_once(port: int) -> bool:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{PATH}",
        data=b"{}",
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return bool(response.status == 200)
    except urllib.error.HTTPError as exc:
        raise SystemExit(f"the app answered {exc.code}: see its output above") from None
    except OSError:
        return False


@contextlib.contextmanager
def serving(server: str, env: dict[str, str], cpus: Cpus) -> Iterator[tuple[int, int]]:
    port = free_port()
    process = subprocess.Popen(server_command(server, port), env=env, preexec_fn=cpus.run_app)
    try:
        deadline = time.monotonic() + 60
        while not answered_once(port):
            if process.poll() is not None:
                raise SystemExit(f"{server}: the server exited with {process.returncode}")
            if time.monotonic() > deadline:
                raise SystemExit(f"{server}: no answer on port {port} in 60 s")
            time.sleep(0.05)
        yield port, process.pid
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def gc_seconds(port: int) -> float:
    """The app's time in the garbage collector so far (``webapp_apps.GcClock``)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/gc", timeout=10) as response:
        return float(json.load(response)["seconds"])


def cpu_seconds(pid: int) -> float:
    """CPU of the server process and its children (gunicorn's worker)."""
    total = 0
    pids = [pid]
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            text = Path(f"/proc/{pid}/task/{task}/children").read_text()
            pids += [int(p) for p in text.split()]
    for each in pids:
        with contextlib.suppress(OSError):
            text = Path(f"/proc/{each}/stat").read_text()
            fields = text[text.rindex(")") + 2 :].split()
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def millis(text: str) -> float:
    found = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    if found is None:
        raise ValueError(f"a latency wrk wrote as {text!r}")
    number, unit = found.groups()
    return float(number) * {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0}[unit]


def wrk(port: int, seconds: int, script: Path, cpus: Cpus) -> tuple[float, float, float, int, int]:
    argv = ["wrk", "-t1", f"-c{CONNECTIONS}", f"-d{seconds}s", "--latency", "-s", str(script),
            f"http://127.0.0.1:{port}{PATH}"]  # fmt: skip
    done = subprocess.run(
        argv, check=True, capture_output=True, text=True, preexec_fn=cpus.run_rest
    )
    out = done.stdout

    def field(pattern: str) -> str:
        found = re.search(pattern, out)
        if found is None:
            raise SystemExit(f"wrk's output has no {pattern!r}:\n{out}")
        return found.group(1)

    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    non_2xx = int(bad.group(1)) if bad else 0
    failed = non_2xx + (sum(map(int, errors.groups())) if errors else 0)
    total = int(field(r"(\d+) requests in"))
    rate = float(field(r"Requests/sec:\s+([\d.]+)"))
    return (
        rate,
        millis(field(r"(?m)^\s+50%\s+(\S+)\s*$")),
        millis(field(r"(?m)^\s+99%\s+(\S+)\s*$")),
        total - non_2xx,
        failed,
    )


def measure(
    key: tuple[str, str, str],
    args: argparse.Namespace,
    url: str,
    topology: Topology,
    script: Path,
    cpus: Cpus,
) -> Run:
    server, gc_setting, mode = key
    env = dict(
        os.environ,
        DELAYQ_BENCH_URL=url,
        DELAYQ_BENCH_NAMESPACE=topology.namespace,
        DELAYQ_BENCH_MODE=mode,
        DELAYQ_BENCH_GC=gc_setting,
        DELAYQ_BENCH_WAIT_MS=str(args.wait_ms),
    )
    tier = topology.tier_name(topology.ladder.tiers[0])
    publish = mode == "publish"
    with serving(server, env, cpus) as (port, pid):
        wrk(port, args.warmup, script, cpus)
        before_depth = queue_depth(url, tier) if publish else 0
        before_cpu, before_gc = cpu_seconds(pid), gc_seconds(port)
        rate, p50, p99, answered, failed = wrk(port, args.seconds, script, cpus)
        cpu = cpu_seconds(pid) - before_cpu
        collecting = gc_seconds(port) - before_gc
        if publish:
            # A request still in the app when wrk stopped (the warm-up's, or this
            # run's) may yet be confirmed: the tier then holds it too, at most one a
            # connection each time.
            grown = queue_depth(url, tier) - before_depth
            if not answered <= grown <= answered + 2 * CONNECTIONS:
                raise SystemExit(
                    f"{server}: {answered} requests answered but the tier grew by {grown}"
                )
    per_request = 1e6 / max(answered, 1)
    return Run(rate, p50, p99, answered, failed, cpu * per_request, collecting * per_request)


async def publish_many_rate(url: str, topology: Topology, count: int) -> float:
    async with AsyncPublisher(url, topology) as publisher:
        await publisher.publish_many(
            [Message({"order": n}, "orders.reminder", "1h") for n in range(100)]
        )
        messages = [Message({"order": n}, "orders.reminder", "1h") for n in range(count)]
        started = time.perf_counter()
        await publisher.publish_many(messages)
        return count / (time.perf_counter() - started)


def paired(mine: list[Run], theirs: list[Run], field: str) -> float:
    """The median of each round's ratio: a round's runs are next to each other in time,
    so a machine that drifts between rounds moves both alike."""
    return statistics.median(
        getattr(a, field) / getattr(b, field) for a, b in zip(mine, theirs, strict=True)
    )


def report(
    args: argparse.Namespace, runs: dict[tuple[str, str, str], list[Run]], many: float
) -> None:
    print(
        f"# load after: {load_average()}; medians of {args.rounds} rounds, "
        f"{args.seconds} s each, {CONNECTIONS} connections, wait {args.wait_ms} ms"
    )
    line = "{:<13} {:<8} {:<8} {:>8} {:>7} {:>7} {:>7} {:>6} {:>6}"
    print(
        line.format(
            "server", "gc", "mode", "req/s", "p50 ms", "p99 ms", "µs CPU", "of GC", "failed"
        )
    )
    for server in args.servers:
        for gc_setting in args.gc:
            med: dict[str, Run] = {}
            for mode in MODES:
                each = runs[(server, gc_setting, mode)]
                fields = [
                    statistics.median(getattr(r, f) for r in each) for f in Run.__annotations__
                ]
                one = med[mode] = Run(*fields)  # type: ignore[arg-type]
                row = [server, gc_setting, mode, f"{one.rate:,.0f}", f"{one.p50_ms:.1f}"]
                row += [f"{one.p99_ms:.1f}", f"{one.cpu_us:.0f}", f"{one.gc_us:.0f}"]
                row += [str(sum(r.failed for r in each))]
                print(line.format(*row))
            pub, none = med["publish"], med["none"]

            mine = runs[(server, gc_setting, "publish")]
            alone, waiting = runs[(server, gc_setting, "none")], runs[(server, gc_setting, "wait")]
            to_none, p99_x = paired(mine, alone, "rate"), paired(mine, alone, "p99_ms")
            to_wait, cpu_x = paired(mine, waiting, "rate"), pub.cpu_us / none.cpu_us
            print(
                f"{server:<13} {gc_setting:<8} publish at {to_none:.2f} of none "
                f"(p99 x{p99_x:.1f}), {to_wait:.2f} of wait, {pub.rate / many:.2f} of "
                f"publish_many; CPU a request x{cpu_x:.2f}"
            )
    print(f"publish_many {many:,.0f} msg/s (AsyncPublisher, {args.many_count:,} messages)")


def _interrupted(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: Sequence[str] | None = None) -> int:
    # SIGTERM as Ctrl-C: the app server stopped, the namespace deleted, the folders removed.
    signal.signal(signal.SIGTERM, _interrupted)
    try:
        return _main(argv)
    except KeyboardInterrupt as exc:
        log(f"interrupted ({exc or 'SIGINT'}): the app, its namespace and files are cleaned up")
        return 130
    except DelayqError as exc:
        print(f"webapp.py: error: {exc}", file=sys.stderr)
        return 1


def _main(argv: Sequence[str] | None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed: apt-get install wrk (scripts/setup.sh --test does)")
    print(f"# {command_line(sys.argv[1:] if argv is None else argv)}")
    cpus = Cpus.choose(args.pin)
    with broker(args.url) as (url, node), tempfile.TemporaryDirectory() as tmp:
        if cpus.app is not None:
            where = f"the app on CPU {sorted(cpus.app)}, wrk on {sorted(cpus.rest or ())}"
            if node is not None:
                found = cpus.move_node(node)
                where += " with the local broker" if found else " (the local broker: not found)"
            print(f"# {where} (--no-pin: anywhere)")
        script = Path(tmp, "post.lua")
        script.write_text(POST_SCRIPT)
        topology = Topology(
            namespace=f"bench{uuid.uuid4().hex[:8]}", ladder=["1h"], external_bindings=("orders.#",)
        )
        print(f"# broker: {broker_version(url)}; load before: {load_average()}")
        runs: dict[tuple[str, str, str], list[Run]] = {}
        many: list[float] = []
        keys = [(s, g, m) for s in args.servers for g in args.gc for m in MODES]
        try:
            apply_topology(topology, url)
            for round_no in range(args.rounds):
                for key in keys if round_no % 2 == 0 else reversed(keys):
                    log(f"round {round_no + 1}: {' '.join(key)} ...")
                    run = measure(key, args, url, topology, script, cpus)
                    runs.setdefault(key, []).append(run)
                    log(f"  {run.rate:,.0f} requests/s, p99 {run.p99_ms:.1f} ms, "
                        f"{run.cpu_us:.0f} µs CPU a request ({run.gc_us:.0f} in GC)")  # fmt: skip
                many.append(asyncio.run(publish_many_rate(url, topology, args.many_count)))
                log(f"  publish_many: {many[-1]:,.0f} msg/s")
        finally:
            delete_topology(topology, url)
        report(args, runs, statistics.median(many))
    problem = verdict(runs)
    if problem is not None:
        print(f"PROBLEM: {problem}", file=sys.stderr)
        return 1
    return 0


def verdict(runs: dict[tuple[str, str, str], list[Run]]) -> str | None:
    """Why the figures of ``runs`` measure nothing (a request failed), or ``None``."""
    failed = {" ".join(key): sum(r.failed for r in each) for key, each in runs.items()}
    failed = {key: n for key, n in failed.items() if n}
    if not failed:
        return None
    where = ", ".join(f"{key}: {n:,}" for key, n in failed.items())
    return (
        f"requests failed ({where}; a non-2xx answer, or wrk's socket errors and "
        "timeouts): the figures above do not measure what they say"
    )


if __name__ == "__main__":
    raise SystemExit(main())
