"""Celery's countdowns, and the same through :func:`delayq.integrations.celery.install`, on a
real broker with Celery's own worker (``celery worker``, solo pool, prefetch 1).

Celery's own countdown on a quorum queue (Celery's advice for RabbitMQ 4) sent through a
direct exchange (Celery's default) is held by the worker until its time, and a quorum
queue's worker cannot raise its prefetch for it: every task behind it waits (Celery logs
"this task may block the worker process until the ETA arrives"; the stuck countdowns of
celery #9912 and #10111). Through delayq the countdown waits in a tier and the worker
takes the next task at once."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pika
import pytest

from delayq import DelayTooLong, InvalidInput, Topology
from delayq.sync import delete_topology
from tests.waiting import first_message, wait_for

APP = """
import os, time
from celery import Celery
from delayq import Topology

app = Celery("t", broker=os.environ["DELAYQ_URL"])
app.conf.update(
    task_default_queue=os.environ["QUEUE"], task_default_queue_type="quorum",
    worker_prefetch_multiplier=1, broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)
if os.environ.get("ROUTES"):  # two direct exchanges, a queue each, bound by the same key
    from kombu import Exchange, Queue
    q = os.environ["QUEUE"]
    app.conf.task_queues = [Queue(f"{q}.{x}", Exchange(f"{q}.x{x}", "direct"), routing_key="k")
                            for x in "ab"]
if os.environ.get("NAMESPACE"):
    from delayq.integrations.celery import install
    extra = {"tier_max_length": int(os.environ["TIER_MAX"])} if os.environ.get("TIER_MAX") else {}
    if os.environ.get("EXACT"):
        extra.update(strategy="exact", exact={"unit": "100ms", "levels": 10})
    install(
        app, topology=Topology(namespace=os.environ["NAMESPACE"], ladder=["1s", "8s"], **extra),
        apply=not os.environ.get("NO_APPLY"),
    )
RAN = os.environ["RAN"]


def note(text):
    with open(RAN, "a") as out:
        out.write(f"{time.time():.3f} {text}\\n")


@app.task
def mark(tag):
    note(tag)


@app.task(bind=True)
def flaky(self, tries):
    deaths = (self.request.headers or {}).get("x-death") or []
    note(f"flaky {self.request.retries} {sum(d['count'] for d in deaths)}")
    if self.request.retries < tries:
        raise self.retry(countdown=1, max_retries=5)


@app.task(bind=True, max_retries=1)
def once_more(self, tag):
    note(f"{tag} {self.request.retries}")
    if not self.request.retries:
        raise self.retry(countdown=1)


@app.task(bind=True)
def far(self):
    note(f"far {self.request.retries}")
    raise self.retry(countdown=3600)  # longer than the 8 s ladder
"""


class Worker:
    def __init__(self, tmp_path: Path, url: str, queue: str, namespace: str) -> None:
        (tmp_path / "capp.py").write_text(APP, encoding="utf-8")
        self.ran = tmp_path / "ran.txt"
        self.ran.touch()
        self.env = {
            **os.environ, "DELAYQ_URL": url, "QUEUE": queue, "NAMESPACE": namespace,
            "RAN": str(self.ran), "PYTHONPATH": str(tmp_path),
        }  # fmt: skip
        self.cwd = tmp_path
        self.proc: subprocess.Popen[bytes] | None = None

    def send(self, code: str) -> subprocess.CompletedProcess[str]:
        """Run ``code`` in a sender process importing the app; its output captured."""
        return subprocess.run(
            [sys.executable, "-c", f"from capp import *\n{code}"], cwd=self.cwd, env=self.env,
            capture_output=True, text=True, check=True, timeout=120,
        )  # fmt: skip

    def start(self) -> None:
        log = (self.cwd / "worker.log").open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "capp", "worker", "--pool", "solo",
             "-c", "1", "--without-gossip", "--without-mingle", "-l", "info"],
            cwd=self.cwd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        wait_for(lambda: "ready." in self.log() or self.proc.poll() is not None, 60, "worker")
        assert self.proc.poll() is None, self.log()

    def log(self) -> str:
        return (self.cwd / "worker.log").read_text()

    def runs(self) -> list[tuple[float, str]]:
        lines = self.ran.read_text().splitlines()
        return [(float(t), text) for t, _, text in (line.partition(" ") for line in lines)]

    def wait_runs(self, count: int, timeout_s: float = 60) -> list[tuple[float, str]]:
        what = lambda: f"{count} runs: {self.log()}"  # noqa: E731
        wait_for(lambda: len(self.runs()) >= count, timeout_s, what)
        return self.runs()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@pytest.fixture
def worker(
    tmp_path: Path, rabbitmq_url: str, names: Callable[[str], str], request: pytest.FixtureRequest
) -> Iterator[Callable[[str], Worker]]:
    made: list[tuple[Worker, str]] = []

    def make(namespace: str) -> Worker:
        made.append((Worker(tmp_path, rabbitmq_url, names("celery"), namespace), namespace))
        return made[-1][0]

    yield make
    for each, namespace in made:
        each.stop()
        if namespace:
            delete_topology(Topology(namespace=namespace, ladder=["1s", "8s"]), rabbitmq_url)


def test_celerys_countdown_on_a_quorum_queue_holds_every_task_behind_it(
    worker: Callable[[str], Worker],
) -> None:
    w = worker("")
    w.start()
    sent = time.time()
    w.send("mark.apply_async(('late',), countdown=6); mark.delay('now')")
    runs = dict((text, at - sent) for at, text in w.wait_runs(2))
    assert runs["now"] >= 5, runs  # held behind the countdown the worker holds


def test_through_delayq_the_countdown_waits_in_a_tier_and_the_next_task_runs(
    worker: Callable[[str], Worker], names: Callable[[str], str]
) -> None:
    w = worker(names("ns"))
    w.start()
    sent = time.time()
    w.send("mark.apply_async(('late',), countdown=6); mark.delay('now')")
    runs = dict((text, at - sent) for at, text in w.wait_runs(2))
    assert runs["now"] < 5, runs
    assert runs["late"] >= 6 - 0.1, runs
    time.sleep(0)  # nothing else comes: each ran once
    assert len(w.runs()) == 2


def test_a_countdown_sent_before_any_worker_ran_waits_for_one(
    worker: Callable[[str], Worker], names: Callable[[str], str]
) -> None:
    w = worker(names("ns"))
    sent = time.time()
    w.send("mark.apply_async(('early',), countdown=1)")
    w.start()
    ((at, text),) = w.wait_runs(1)
    assert text == "early" and at - sent >= 0.9


@pytest.mark.parametrize("exact", [False, True], ids=["tiers", "exact"])
def test_retries_wait_in_the_tiers_and_carry_no_x_death(
    worker: Callable[[str], Worker], names: Callable[[str], str], exact: bool
) -> None:
    w = worker(names("ns"))
    if exact:
        w.env["EXACT"] = "1"
    w.start()
    w.send("flaky.delay(2)")
    runs = w.wait_runs(3)
    assert [text.split()[1] for _, text in runs] == ["0", "1", "2"], runs
    assert all(b[0] - a[0] >= 0.9 for a, b in itertools.pairwise(runs)), runs
    # each run's x-death is its own pass's (a tier, or the cascade's levels), no more: no
    # retry carries its last pass's on
    deaths = [int(text.split()[2]) for _, text in runs]
    assert deaths[0] == 0 and deaths[1] == deaths[2] >= 1, runs


def test_misuse_is_refused_and_nothing_is_sent(
    worker: Callable[[str], Worker], names: Callable[[str], str], rabbitmq_url: str
) -> None:
    namespace = names("ns")
    w = worker(namespace)
    code = (
        "from delayq import DelayTooLong, InvalidInput\n"
        "from delayq.integrations.celery import install\n"
        "try:\n    mark.apply_async(('x',), countdown=86400)\n"
        "except DelayTooLong as exc:\n    print('refused', exc)\n"
        "try:\n    install(app, topology=Topology(namespace='again'))\n"
        "except InvalidInput as exc:\n    print('refused', exc)\n"
    )
    out = w.send(code)
    assert out.stdout.count("refused") == 2, out
    channel = pika.BlockingConnection(pika.URLParameters(rabbitmq_url)).channel()
    topology = Topology(namespace=namespace, ladder=["1s", "8s"])
    tiers = [channel.queue_declare(topology.tier_name(t), passive=True) for t in topology.ladder]
    assert [t.method.message_count for t in tiers] == [0, 0]
    channel.connection.close()
    assert DelayTooLong and InvalidInput


def test_a_retry_the_tiers_cannot_hold_is_parked_with_its_reason_not_lost(
    worker: Callable[[str], Worker], names: Callable[[str], str], rabbitmq_url: str
) -> None:
    w = worker(names("ns"))
    w.start()
    w.send("far.delay()")
    assert [text for _, text in w.wait_runs(1)] == ["far 0"]
    method, properties, _body = first_message(rabbitmq_url, f"{w.env['NAMESPACE']}.celery-parked")
    assert method is not None, w.log()
    assert "retry not scheduled" in properties.headers["x-delayq-reason"]
    assert properties.headers["task"] == "capp.far" and properties.headers["retries"] == 1


def test_without_the_topology_applied_a_countdown_and_a_worker_say_so(
    worker: Callable[[str], Worker], names: Callable[[str], str]
) -> None:
    w = worker(names("ns"))
    w.env["NO_APPLY"] = "1"
    code = (
        "from delayq import TopologyMissing\n"
        "try:\n    mark.apply_async(('x',), countdown=2)\n"
        "except TopologyMissing as exc:\n    print('refused', type(exc).__name__)\n"
    )
    out = w.send(code)
    assert "refused TopologyNotApplied" in out.stdout, out
    with pytest.raises(AssertionError):
        w.start()  # the worker stops at start-up
    assert "TopologyNotApplied" in w.log(), w.log()


def test_a_countdown_its_tier_would_keep_past_its_expiry_is_refused(
    worker: Callable[[str], Worker], names: Callable[[str], str]
) -> None:
    w = worker(names("ns"))
    code = (
        "from delayq import InvalidInput\n"
        "try:\n    mark.apply_async(('x',), countdown=2, expires=4)\n"  # waits 8 s
        "except InvalidInput as exc:\n    print('refused', exc)\n"
        "mark.apply_async(('y',), countdown=2, expires=30)\n"
    )
    out = w.send(code)
    assert "refused" in out.stdout and "expires" in out.stdout, out
    w.start()
    assert [text for _, text in w.wait_runs(1)] == ["y"]


def test_a_retry_a_full_tier_refuses_is_parked_not_lost(
    worker: Callable[[str], Worker], names: Callable[[str], str], rabbitmq_url: str
) -> None:
    w = worker(names("ns"))
    w.env["TIER_MAX"] = "1"  # the 1s tier holds one: most of six retries in a row are refused
    w.start()
    w.send("for i in range(6):\n    once_more.delay(f't{i}')")
    firsts = [text for _, text in w.wait_runs(6) if text.endswith(" 0")]
    assert len(firsts) == 6
    namespace = w.env["NAMESPACE"]

    def accounted() -> bool:  # each either retried, or parked with its reason
        connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
        try:
            parked = connection.channel().queue_declare(f"{namespace}.celery-parked", passive=True)
            count = parked.method.message_count
        except pika.exceptions.ChannelClosedByBroker:
            count = 0
        finally:
            connection.close()
        retried = [text for _, text in w.runs() if text.endswith(" 1")]
        return len(retried) + count == 6 and count > 0

    wait_for(accounted, 60, lambda: f"6 retried or parked: {w.runs()}")


def test_a_countdown_reaches_the_queue_its_own_exchange_routes_it_to(
    worker: Callable[[str], Worker], names: Callable[[str], str], rabbitmq_url: str
) -> None:
    """Two direct exchanges bind a queue each by the same key: a countdown published to
    one reaches its queue alone, as without a countdown (no copy, no other queue)."""
    w = worker(names("ns"))
    w.env["ROUTES"] = "1"
    queue = w.env["QUEUE"]
    w.send(
        f"mark.apply_async(('a0',), queue='{queue}.a', countdown=1)\n"  # binds both queues
        f"mark.apply_async(('b0',), queue='{queue}.b', countdown=1)\n"
        f"mark.apply_async(('to-b',), exchange='{queue}.xb', routing_key='k', countdown=1)\n"
    )

    def counts() -> tuple[int, int]:
        connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
        channel = connection.channel()
        found = tuple(
            channel.queue_declare(f"{queue}.{x}", passive=True).method.message_count for x in "ab"
        )
        connection.close()
        return found[0], found[1]

    wait_for(lambda: counts() == (1, 2), 30, lambda: f"1 in a, 2 in b: {counts()}")
    time.sleep(1.5)  # a copy would be due by now
    assert counts() == (1, 2)
