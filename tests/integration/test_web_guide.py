"""The web-app guide's examples, run as it shows them: each app file and server command
taken from docs/guides/web-apps.md, served by uvicorn (its default loop: uvloop) or
gunicorn, loaded by concurrent clients. Every request answered ``200`` names a message
the broker holds, once; a broker restart under load and a SIGTERM with requests in
flight lose none."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pika
import pytest

from delayq import Topology
from delayq.local.node import LocalNode
from delayq.local.ports import free_port
from delayq.sync import apply_topology, delete_topology
from tests.guide_blocks import ROOT, block, blocks
from tests.proxy import HoldingProxy
from tests.waiting import wait_for

GUIDE = ROOT / "docs" / "guides" / "web-apps.md"
BIN = Path(sys.executable).parent
PATH = "/orders/{}/reminder"


@pytest.fixture
def shop(rabbitmq_url: str) -> Iterator[Topology]:
    """The guide's topology under a namespace of this test's own, applied."""
    topo = Topology(namespace=f"shop{uuid.uuid4().hex[:8]}", external_bindings=("orders.#",))
    apply_topology(topo, rabbitmq_url)
    yield topo
    delete_topology(topo, rabbitmq_url)


def write_app(folder: Path, name: str, topo: Topology) -> None:
    text = block(GUIDE, "python", f"# {name}")
    assert 'namespace="shop"' in text
    (folder / name).write_text(text.replace('namespace="shop"', f'namespace="{topo.namespace}"'))


def command(starting: str, port: int) -> list[str]:
    """The guide's shell line that starts with ``starting``, on ``port``."""
    lines = [ln for t in _sh_blocks() for ln in t.splitlines() if ln.startswith(starting)]
    assert len(lines) == 1, lines
    words = lines[0].replace("8000", str(port)).split()
    return [str(BIN / words[0]), *words[1:]]


def _sh_blocks() -> list[str]:
    return [text for language, text in blocks(GUIDE) if language == "sh"]


def post(conn: http.client.HTTPConnection, order: int) -> tuple[int, dict[str, object], str]:
    conn.request(
        "POST", PATH.format(order), body=b"{}", headers={"Content-Type": "application/json"}
    )
    response = conn.getresponse()
    body = json.loads(response.read() or b"{}")
    return response.status, body, response.getheader("Retry-After") or ""


@contextmanager
def serving(
    argv: list[str], folder: Path, url: str, port: int
) -> Iterator[subprocess.Popen[bytes]]:
    env = dict(os.environ, RABBITMQ_URL=url, PYTHONPATH=str(folder))
    process = subprocess.Popen(argv, cwd=folder, env=env, start_new_session=True)
    try:

        def up() -> bool:
            if process.poll() is not None:
                raise AssertionError(f"{argv[0]} exited with {process.returncode}")
            try:
                socket_ok = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                socket_ok.connect()
                socket_ok.close()
                return True
            except OSError:
                return False

        wait_for(up, 60, f"{' '.join(argv)} to take connections")
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


class Clients:
    """``threads`` clients, each on a keep-alive connection, sending ``each`` requests."""

    def __init__(self, port: int, threads: int, each: int) -> None:
        self.answers: list[tuple[int, dict[str, object], str]] = []
        self.failures: list[BaseException] = []
        self.waiting = 0
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._run, args=(port, n * each, each), daemon=True)
            for n in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    def _run(self, port: int, first: int, each: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        try:
            for order in range(first, first + each):
                with self._lock:
                    self.waiting += 1
                answer = post(conn, order)
                with self._lock:
                    self.waiting -= 1
                    self.answers.append(answer)
        except BaseException as exc:
            self.failures.append(exc)
        finally:
            conn.close()

    def join(self) -> None:
        for thread in self._threads:
            thread.join(180)
            assert not thread.is_alive(), "a client still waits for its answer"
        assert not self.failures, self.failures[:3]


def held_ids(url: str, topo: Topology) -> Counter[str]:
    """The message ids in the namespace's 30 m tier (a 15 m delay waits there), taken out."""
    queue = topo.tier_name(topo.ladder.select("15m"))
    connection = pika.BlockingConnection(pika.URLParameters(url))
    ids: Counter[str] = Counter()
    try:
        channel = connection.channel()
        while True:
            method, props, _body = channel.basic_get(queue, auto_ack=True)
            if method is None:
                return ids
            ids[props.message_id] += 1
    finally:
        connection.close()


def confirmed(clients: Clients) -> list[str]:
    statuses = Counter(status for status, _, _ in clients.answers)
    assert set(statuses) <= {200, 503}, statuses
    for status, _body, retry_after in clients.answers:
        if status == 503:
            assert retry_after, "a 503 without Retry-After"
    return [str(body["message_id"]) for status, body, _ in clients.answers if status == 200]


APPS = {
    "uvicorn": ("app.py", "uvicorn app:app"),
    "gunicorn-uvicorn": ("app.py", "gunicorn app:app"),
    "flask": ("flask_app.py", "gunicorn flask_app:app"),
    "django": ("django_app.py", "gunicorn django_app"),
}


@pytest.mark.parametrize("server", list(APPS))
def test_each_answered_request_is_a_message_held_once(server, shop, rabbitmq_url, tmp_path):
    name, starting = APPS[server]
    write_app(tmp_path, name, shop)
    port = free_port()
    with serving(command(starting, port), tmp_path, rabbitmq_url, port):
        clients = Clients(port, threads=32, each=25)
        clients.join()
    ids = confirmed(clients)
    assert len(ids) == 800 and len(set(ids)) == 800
    assert held_ids(rabbitmq_url, shop) == Counter(ids)


def test_the_uvicorn_app_rides_through_a_broker_restart(tmp_path):
    """The node restarts while publishes are held mid-load (by construction, not timing):
    every request is answered, every 200 names a message the broker holds."""
    with LocalNode() as node:
        topo = Topology(namespace=f"shop{uuid.uuid4().hex[:8]}", external_bindings=("orders.#",))
        apply_topology(topo, node.url)
        write_app(tmp_path, "app.py", topo)
        port = free_port()
        with HoldingProxy(node.url, hold_after=300) as proxy:
            with serving(command("uvicorn app:app", port), tmp_path, proxy.url, port):
                clients = Clients(port, threads=32, each=25)
                wait_for(proxy.holding.is_set, 120, "the proxy to hold the publishes")
                node.restart()
                clients.join()
        ids = confirmed(clients)
        assert len(clients.answers) == 800
        held = held_ids(node.url, topo)
        assert not set(ids) - set(held), "a request answered 200 whose message is gone"


def test_sigterm_answers_the_requests_in_flight_before_the_app_exits(tmp_path, rabbitmq_url, shop):
    """16 requests publish; the proxy holds all 16 publishes (counted there, so they are
    certainly in flight); the server is told to stop; the publishes then go through:
    each request is answered 200, its message is held, and uvicorn exits after the
    lifespan closed the publisher. One request first, before the hold, so that the
    publisher has checked the tier exchange: a check held with the publishes would keep
    the request that sent it from publishing at all."""
    write_app(tmp_path, "app.py", shop)
    port = free_port()
    with HoldingProxy(rabbitmq_url, hold_after=2, read_while_holding=True) as proxy:
        with serving(command("uvicorn app:app", port), tmp_path, proxy.url, port) as server:
            first = Clients(port, threads=1, each=1)
            first.join()
            clients = Clients(port, threads=16, each=1)
            wait_for(lambda: proxy.published >= 17, 60, lambda: f"{proxy.published} of 17 held")
            assert not clients.answers
            os.killpg(server.pid, signal.SIGTERM)
            proxy.release()
            clients.join()
            # uvicorn raises the signal again once it has shut down gracefully
            assert server.wait(60) in (0, -signal.SIGTERM)
    ids = confirmed(first) + confirmed(clients)
    assert len(ids) == 17
    assert held_ids(rabbitmq_url, shop) == Counter(ids)
