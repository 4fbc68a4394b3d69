"""The benchmarks of docs/project/performance.md run as documented, against a real broker:
small counts, one round, each mode's own checks (every message delivered once, queues
left empty) on. The rates are not looked at: they are measured by the scripts, never
asserted by a test; what is checked is that a mode does what it reports (a work mode
spends its CPU, a counter it prints is read)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.bench  # CI runs them on its first server (docs/project/tests.md)


def _bench(script: str, *args: str, url: str) -> str:
    result = subprocess.run(
        [sys.executable, f"bench/{script}", "--url", url, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, f"{script} {args}: exit {result.returncode}\n{result.stderr}"
    assert "Traceback" not in result.stderr, result.stderr
    return result.stdout


@pytest.mark.timeout(700)
def test_the_end_to_end_bench_runs_the_raw_path_and_delayq(rabbitmq_url: str) -> None:
    # At a fixed rate: the search runs (twice as many, at the path's limit) are run by
    # the raw-work test below.
    out = _bench(
        "e2e.py",
        "--modes",
        "raw,memory",
        "--seconds",
        "4",
        "--rounds",
        "2",
        "--rate",
        "2000",
        url=rabbitmq_url,
    )
    assert "raw frames (the ceiling)" in out and "AsyncConsumer + InMemoryStore" in out
    assert "round 2/2:" in out and "over 2 rounds" in out and " median " in out, out
    assert "PROBLEM" not in out


@pytest.mark.timeout(700)
def test_the_consume_bench_runs_the_sync_consumer_beside_raw_pika(rabbitmq_url: str) -> None:
    out = _bench(
        "consume.py",
        "--count",
        "2000",
        "--rounds",
        "1",
        "--modes",
        "raw-pika,sync-memory",
        url=rabbitmq_url,
    )
    assert "raw pika consumer" in out and "sync Consumer + InMemoryStore" in out


@pytest.mark.timeout(700)
def test_the_end_to_end_bench_runs_the_raw_path_with_a_clients_work(rabbitmq_url: str) -> None:
    out = _bench(
        "e2e.py",
        "--modes",
        "raw,raw-work",
        "--work-us",
        "200,300",
        "--seconds",
        "4",
        url=rabbitmq_url,
    )
    assert "the raw clients spend 200 us (publisher) and 300 us (consumer)" in out, out
    assert "search run" in out and "fixed run" in out, out
    assert "PROBLEM" not in out
    rows = {line[:40].strip(): line.split() for line in out.split("\n\n", 1)[0].splitlines()}
    raw, working = rows["raw frames (the ceiling)"], rows["raw frames + --work-us of CPU a message"]
    # The CPU a message of each side (its last columns: publisher, consumer, broker): the
    # work is spent, and by that mode alone.
    assert float(working[-3]) >= 200 and float(working[-2]) >= 300, out
    assert float(raw[-3]) < 200 and float(raw[-2]) < 300, out


@pytest.mark.timeout(700)
def test_the_consume_bench_runs_the_raw_twins_of_a_clients_work_and_of_handler_threads(
    rabbitmq_url: str,
) -> None:
    out = _bench(
        "consume.py",
        "--count",
        "2000",
        "--rounds",
        "1",
        "--work-us",
        "50",
        "--modes",
        "limit,limit-work,raw-pika-threads",
        url=rabbitmq_url,
    )
    rows = {line.split("  ", 1)[0]: line for line in out.split("per mode:", 1)[0].splitlines()}
    for mode in ("the limit + --work-us of CPU a delivery", "raw pika, 8 handler threads"):
        assert mode in rows and "skipped" not in rows[mode], out  # measured, with a rate
    assert "not among --modes" in rows["sync Consumer + InMemoryStore"], out  # extra only
    assert "(the limit + work: 50 us of CPU a delivery, --work-us)" in out, out
    # Client CPU a delivery (the rows' last column): the work is spent, by that mode alone.
    assert float(rows["the limit + --work-us of CPU a delivery"].split()[-1]) >= 50, out
    assert float(rows["limit: raw frames, multiple acks"].split()[-1]) < 50, out


@pytest.mark.timeout(700)
def test_the_publish_bench_runs_concurrent_callers(rabbitmq_url: str) -> None:
    out = _bench(
        "publish.py",
        "--modes",
        "async-callers,sync-callers-each,sync-callers-shared,"
        "sync-many-narrow,raw-pika-callers-shared,thread-handoff",
        "--callers",
        "20",
        "--batch-count",
        "2000",
        "--rounds",
        "1",
        url=rabbitmq_url,
    )
    assert "coroutines x async publish vs publish_many" in out
    assert "threads x 1 Publisher each vs publish_many" in out
    assert "threads x 1 shared Publisher vs publish_many (window 20)" in out
    assert "publish_many, window 20 vs" in out
    assert "20 threads x 1 shared Publisher vs raw pika, 1 I/O thread" in out
    assert "raw pika, 20 threads to 1 I/O thread vs publish_many" in out
    # The hand-off alone, measured (it sends nothing: the bench fails if the tier queue
    # holds other than the sending modes' messages).
    assert "20 threads to 1 thread, no broker, vs publish_many" in out
    floor = [ln for ln in out.splitlines() if "N threads handing to 1 thread, no broker" in ln]
    assert len(floor) == 1 and "msg/s" in floor[0], out
    # Threads waiting on locks switch: the count is read (every thread's), not left at 0.
    switches = float(floor[0].rsplit(",", 1)[1].split()[0])
    assert switches > 0, floor[0]


@pytest.mark.timeout(700)
def test_the_publish_bench_runs_raw_frames_with_a_clients_work_beside_the_limit(
    rabbitmq_url: str,
) -> None:
    out = _bench(
        "publish.py",
        "--modes",
        "raw-frames,raw-frames-work,async-many",
        "--work-us",
        "3",
        "--batch-count",
        "2000",
        "--rounds",
        "1",
        url=rabbitmq_url,
    )
    assert "raw frames + N us of client CPU a message" in out and "(N = 3 us: --work-us)" in out
    share = out.split("share of the physical limit", 1)[1]
    assert "raw frames + N us of client CPU a message" in share, out


NOT_US = ("-1", "nan", "inf", "fast")
"""``--work-us`` values no bench takes (the end-to-end one takes two numbers)."""


@pytest.mark.parametrize(
    ("script", "value"),
    [
        *((script, value) for script in ("publish.py", "consume.py") for value in NOT_US),
        *(("e2e.py", value) for value in ("-1", "1,nan", "1,2,3", "fast")),
    ],
)
def test_the_benches_refuse_a_work_us_that_is_not_finite_non_negative_numbers(
    script: str, value: str
) -> None:
    result = subprocess.run(
        [sys.executable, f"bench/{script}", "--work-us", value],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result
    assert "--work-us" in result.stderr and "Traceback" not in result.stderr, result.stderr


@pytest.mark.parametrize("value", ["0", "-5", "many"])
def test_the_end_to_end_bench_refuses_a_prefetch_below_one_before_starting_a_node(
    value: str,
) -> None:
    result = subprocess.run(
        [sys.executable, "bench/e2e.py", "--prefetch", value],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2, result
    assert "--prefetch" in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert "local RabbitMQ node" not in result.stderr


@pytest.mark.timeout(700)
def test_the_bridge_bench_runs_the_bridge_beside_both_raw_relays(rabbitmq_url: str) -> None:
    out = _bench("bridge.py", "--count", "2000", "--rounds", "1", url=rabbitmq_url)
    for mode in ("raw pika, confirm each", "raw pika, pipelined confirms", "delayq bridge"):
        assert mode in out, out
    assert "bridge / mode" in out and "PROBLEM" not in out, out


def test_the_webapp_bench_serves_each_app_in_each_mode(rabbitmq_url: str) -> None:
    """Each app's three modes, its ratios, and publish_many's figure; the bench itself fails
    if the tier holds fewer messages than requests were answered. (Two of the three
    servers and one gc setting: the others differ by a flag of the same command.)"""
    out = _bench(
        "webapp.py", "--rounds", "1", "--seconds", "1", "--warmup", "1",
        "--many-count", "1000", "--servers", "asgi,wsgi", "--gc", "freeze", url=rabbitmq_url,
    )  # fmt: skip
    if len(os.sched_getaffinity(0)) >= 2:  # the app on a CPU of its own, wrk on the others
        assert re.search(r"(?m)^# the app on CPU \[\d+\], wrk on \[[\d, ]+\]", out), out
    for server in ("asgi", "wsgi"):
        for mode in ("none", "wait", "publish"):
            # rate, p50, p99, µs CPU and µs of it in GC a request, failed
            row = rf"(?m)^{server} +freeze +{mode} +[\d,]+ +[\d.]+ +[\d.]+ +\d+ +\d+ +0$"
            assert re.search(row, out), out
        found = rf"(?m)^{server} +freeze +publish at [\d.]+ of none \(p99 x[\d.]+\), [\d.]+ of wait"
        assert re.search(found, out), out
    assert "publish_many" in out, out


def test_the_webapp_bench_refuses_an_unknown_server_before_starting_anything() -> None:
    result = subprocess.run(
        [sys.executable, "bench/webapp.py", "--servers", "asgi,tornado"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2 and "tornado" in result.stderr, result.stderr
    twice = subprocess.run(
        [sys.executable, "bench/webapp.py", "--gc", "freeze,freeze"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert twice.returncode == 2 and "names freeze twice" in twice.stderr, twice.stderr


def test_the_webapp_bench_stopped_by_sigterm_leaves_no_server_and_no_namespace(
    local_rabbitmq_node: Any,
) -> None:
    """SIGTERM as Ctrl-C: the app server is stopped, the bench's namespace deleted."""
    import signal

    def queues() -> set[str]:
        listed = local_rabbitmq_node.ctl("list_queues", "name", "--quiet")
        return set(re.findall(r"bench[0-9a-f]{8}", listed))

    before = queues()
    bench = subprocess.Popen(
        [sys.executable, "bench/webapp.py", "--url", local_rabbitmq_node.url, "--rounds", "1",
         "--seconds", "60", "--servers", "asgi", "--gc", "freeze"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert bench.stderr is not None
    for line in bench.stderr:  # a state: the first run is under load
        if "round 1: asgi freeze none" in line:
            break
    made = queues() - before
    servers = _children(bench.pid)  # its app server (another test may run its own)
    bench.send_signal(signal.SIGTERM)
    _out, err = bench.communicate(timeout=120)
    assert bench.returncode == 130, err
    assert "Traceback" not in err and "interrupted (SIGTERM)" in err, err
    assert made and not made & queues(), (made, queues())
    assert servers and not any(Path(f"/proc/{pid}").exists() for pid in servers), servers


def _children(pid: int) -> list[int]:
    """``pid``'s child processes, by /proc."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


@pytest.mark.parametrize("frameworks", ["dramatiq,taskiq", "celery,faststream"])
def test_the_frameworks_bench_runs_each_framework_by_its_broker_and_by_delayq(
    rabbitmq_url: str, frameworks: str
) -> None:
    """Every row: each message ran (the bench exits 1 if one through delayq ran early, never
    or twice), and the worker's held count and memory are read. Two runs of two
    frameworks each (``--frameworks``), side by side on the test workers."""
    out = _bench(
        "frameworks.py", "--messages", "60", "--max-delay", "2", "--held", "300",
        "--frameworks", frameworks, url=rabbitmq_url,
    )  # fmt: skip
    for framework in frameworks.split(","):
        for kind in ("own", "delayq", "delayq-exact")[framework == "faststream" :]:
            late = r"[\d.]+s +[\d.]+s +[\d.]+s"  # p50, p99, max
            row = rf"(?m)^{framework} +{kind} +[\d,]+ +\d+ +{late} +0 +0 +(\d+) +[\d.]+$"
            found = re.search(row, out)
            assert found, out
            if kind != "own":
                assert found.group(1) == "0", out  # nothing held by the worker
    if framework == "taskiq":
        assert re.search(r"(?m)^dramatiq +own .* 300 +[\d.]+$", out), out  # Dramatiq's holds all


@pytest.mark.timeout(700)
def test_the_schedule_bench_measures_the_index_beside_none_and_checks_its_answers(
    rabbitmq_url: str,
) -> None:
    out = _bench(
        "schedule.py", "--messages", "2000", "--rounds", "1", "--entries", "20000",
        url=rabbitmq_url,
    )  # fmt: skip
    assert re.search(r"no index +[\d,]+ msg/s", out), out
    for store, goal in (("sqlite", "0.7"), ("redis", "0.7"), ("postgres", "0.5")):
        line = rf"{store} +[\d,]+ msg/s +[\d.]+ of none \(goal {goal}: (met|NOT met)\)"
        assert re.search(line, out), out
    assert re.search(r"list +[\d.]+ s of 2,000", out) and "purge" in out, out
