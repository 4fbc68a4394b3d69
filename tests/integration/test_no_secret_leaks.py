"""A password never shows: not in logs (delayq's, pika's, aio-pika's, aiormq's, at DEBUG,
in text or JSON), errors (with their chained causes), reprs, CLI output, the worker's
metrics endpoint or the pytest plugin's output.

Every operation below uses a URL whose password is a fresh random string; the
test then searches everything it captured for that string. The user name is not
a secret and does show (in redacted URLs), which proves the capture saw the
clients' DEBUG lines.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import traceback
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from delayq import DelayqError, Message, Topology
from delayq.aio import AsyncConsumer, AsyncPublisher
from delayq.local.node import LocalNode
from delayq.sync import Consumer, Publisher, apply_topology
from delayq.tls import wrapped_errors

SRC = str(Path(__file__).resolve().parents[2] / "src")


class Secret:
    """A user with a random password on a local node, and URLs that carry it."""

    def __init__(self, node: LocalNode) -> None:
        self.password = f"pw{uuid.uuid4().hex}"
        self.user = f"leak{uuid.uuid4().hex[:8]}"
        self.port = node.port
        node.ctl("add_user", self.user, self.password)
        node.ctl("set_permissions", self.user, ".*", ".*", ".*")

    def url(self, *, port: int | None = None, password: str | None = None) -> str:
        pw = self.password if password is None else password
        return f"amqp://{self.user}:{pw}@127.0.0.1:{port or self.port}/"

    @property
    def good(self) -> str:
        return self.url()

    @property
    def wrong_password(self) -> str:
        # the secret is still in the URL: a refused login must not echo it either
        return f"amqp://guest:{self.password}@127.0.0.1:{self.port}/"

    @property
    def unreachable(self) -> str:
        return self.url(port=1)

    @property
    def not_tls(self) -> str:
        return self.url().replace("amqp://", "amqps://") + "?verify=false"

    @property
    def malformed(self) -> list[str]:
        return [
            f"amqp://{self.user}:{self.password}@127.0.0.1:notaport/",
            f"http://{self.user}:{self.password}@127.0.0.1/",
            f"amqp://{self.user}:{self.password}@127.0.0.1/?colour=blue",
            f"amqps://{self.user}:{self.password}@127.0.0.1/?cafile=/no/such.pem",
        ]


@pytest.fixture(scope="module")
def secret(local_rabbitmq_node: LocalNode) -> Secret:
    return Secret(local_rabbitmq_node)


def exception_texts(exc: BaseException) -> list[str]:
    """str, repr and formatted traceback of ``exc`` and everything chained to it."""
    texts = ["".join(traceback.format_exception(type(exc), exc, exc.__traceback__))]
    for current in wrapped_errors(exc):
        texts += [str(current), repr(current), repr(current.args)]
    return texts


@pytest.fixture
def debug_logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    caplog.set_level(logging.DEBUG)  # the root logger: delayq, pika, aio_pika, aiormq
    for name in ("delayq", "pika", "aio_pika", "aiormq"):
        caplog.set_level(logging.DEBUG, logger=name)
    yield caplog


def captured_logs(caplog: pytest.LogCaptureFixture) -> str:
    lines = [caplog.text]
    for record in caplog.records:
        lines.append(record.getMessage())
        if record.exc_info and record.exc_info[1] is not None:
            lines += exception_texts(record.exc_info[1])
    return "\n".join(lines)


def topology() -> Topology:
    ns = f"leak{uuid.uuid4().hex[:8]}"
    return Topology(
        namespace=ns, ladder=["1s"], destinations=[{"queue": f"{ns}.work", "bindings": ["job.#"]}]
    )


def test_no_password_in_logs_errors_or_reprs(
    secret: Secret, debug_logs: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    texts: list[str] = []
    topo = topology()
    queue = f"{topo.namespace}.work"

    def attempt(action: Any) -> None:
        try:
            action()
        except DelayqError as exc:
            texts.extend(exception_texts(exc))

    async def attempt_async(action: Any) -> None:
        try:
            await action()
        except DelayqError as exc:
            texts.extend(exception_texts(exc))

    for url in secret.malformed:
        attempt(lambda url=url: Publisher(url, topo))
        attempt(lambda url=url: AsyncPublisher(url, topo))
        attempt(lambda url=url: Consumer(url, topo, queue, print))
        attempt(lambda url=url: AsyncConsumer(url, topo, queue, print))

    for url in (secret.wrong_password, secret.unreachable, secret.not_tls):
        attempt(lambda url=url: apply_topology(topo, url))
        with Publisher(url, topo, connect_attempts=1) as pub:
            texts.append(repr(pub))
            attempt(lambda pub=pub: pub.publish(b"x", "job.a", "1s"))
            attempt(lambda pub=pub: pub.publish_many([Message(b"x", "job.a", "1s")]))

        async def publish_async(url: str = url) -> None:
            async with AsyncPublisher(url, topo, connect_attempts=1) as pub:
                texts.append(repr(pub))
                await attempt_async(lambda: pub.publish(b"x", "job.a", "1s"))
                await attempt_async(lambda: pub.publish_many([Message(b"x", "job.a", "1s")]))

        asyncio.run(publish_async())
        consumer = Consumer(url, topo, queue, print)
        texts.append(repr(consumer))
        attempt(lambda consumer=consumer: consumer.run(install_signal_handlers=False))

        async def consume_async(url: str = url) -> None:
            consumer = AsyncConsumer(url, topo, queue, print)
            texts.append(repr(consumer))
            await attempt_async(lambda: consumer.run(install_signal_handlers=False))

        asyncio.run(consume_async())

    # Everything working: provision, publish, consume, stop.
    apply_topology(topo, secret.good)
    with Publisher(secret.good, topo) as pub:
        texts.append(repr(pub))
        pub.publish({"n": 1}, "job.a", "0s")
        pub.publish_many([Message({"n": 2}, "job.a", "0s")])
    seen: list[Any] = []
    consumer = Consumer(secret.good, topo, queue, seen.append)
    texts.append(repr(consumer))
    runner = threading.Thread(target=consumer.run, kwargs={"install_signal_handlers": False})
    runner.start()
    assert consumer.started.wait(30)
    runner.join(timeout=0.5)
    consumer.request_stop()
    runner.join(timeout=30)

    async def async_round() -> None:
        async with AsyncPublisher(secret.good, topo) as pub:
            texts.append(repr(pub))
            await pub.publish({"n": 3}, "job.a", "0s")
        consumer = AsyncConsumer(secret.good, topo, queue, seen.append)
        texts.append(repr(consumer))
        task = asyncio.create_task(consumer.run(install_signal_handlers=False))
        for _ in range(200):
            if len(seen) >= 3:
                break
            await asyncio.sleep(0.05)
        consumer.request_stop()
        await asyncio.wait_for(task, 30)

    asyncio.run(async_round())
    assert sorted(b["n"] for b in seen) == [1, 2, 3]

    logs = captured_logs(debug_logs)
    out, err = capfd.readouterr()
    assert texts and logs
    assert secret.user in logs, "the clients' DEBUG lines were not captured"
    assert any("***" in t for t in texts)
    everything = "\n".join([*texts, logs, out, err])
    assert secret.password not in everything


# --- the CLI --------------------------------------------------------------------------------------


def run_cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``delayq ARGS`` with every logger at DEBUG on stderr."""
    code = textwrap.dedent(
        """
        import logging, sys
        logging.basicConfig(level=logging.DEBUG)
        from delayq.cli import main
        sys.exit(main(sys.argv[1:]))
        """
    )
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        env={**os.environ, "PYTHONPATH": SRC},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_no_password_in_cli_output(secret: Secret, tmp_path: Path) -> None:
    topo = topology()
    (tmp_path / "delayq.yaml").write_text(
        f"namespace: {topo.namespace}\nladder: [1s]\ndestinations:\n"
        f"  - queue: {topo.namespace}.work\n    bindings: [job.#]\n"
    )
    publish = ["-k", "job.a", "-d", "1s", "--body", '"hello"']
    runs = {
        # plan uses no broker: its --url is refused (issue 12), without echoing the URL
        "plan": (["topology", "plan", "--url", secret.good], 2),
        "apply": (["topology", "apply", "--url", secret.good], 0),
        "publish": (["publish", "--url", secret.good, *publish], 0),
        "apply-wrong-password": (["topology", "apply", "--url", secret.wrong_password], 1),
        "publish-unreachable": (["publish", "--url", secret.unreachable, *publish], 1),
        "publish-not-tls": (["publish", "--url", secret.not_tls, *publish], 1),
        "apply-malformed": (["topology", "apply", "--url", secret.malformed[0]], 2),
        "publish-unknown-option": (["publish", "--url", secret.malformed[2], *publish], 2),
        "dlq-wrong-password": (
            ["dlq", "list", f"{topo.namespace}.work", "--url", secret.wrong_password],
            1,
        ),
    }
    for name, (args, expected) in runs.items():
        result = run_cli([*args, "-f", "delayq.yaml"], tmp_path)
        assert result.returncode == expected, (name, result.stderr[-2000:])
        output = result.stdout + result.stderr
        assert secret.password not in output, name
        if expected == 0 and args[1] != "plan":
            assert "DEBUG:pika" in result.stderr, f"{name}: no DEBUG lines were captured"


# --- the pytest plugin ----------------------------------------------------------------------------


def test_no_password_in_the_pytest_plugins_output(secret: Secret, tmp_path: Path) -> None:
    (tmp_path / "test_uses_broker.py").write_text(
        textwrap.dedent(
            """
            from delayq import Publisher, Topology

            def test_publish(rabbitmq_url):
                with Publisher(rabbitmq_url, Topology(external_bindings=["#"])) as pub:
                    pub.publish(b"x", "k", "0s")

            def test_fails_on_purpose(rabbitmq_url):
                assert rabbitmq_url.startswith("amqps://"), "not TLS"
            """
        )
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",  # the delayq plugin loads through its entry point
            "-p",
            "no:cacheprovider",
            "-rA",
            "--log-level=DEBUG",
            str(tmp_path),
        ],
        env={**os.environ, "PYTHONPATH": SRC, "RABBITMQ_URL": secret.unreachable},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    output = result.stdout + result.stderr
    assert "2 failed" in output, output[-3000:]
    assert "ConnectionFailed" in output and f"{secret.user}:***@127.0.0.1:1" in output
    assert secret.password not in output


# --- the worker: JSON logs and the metrics endpoint -----------------------------------------------

WORKER_APP = """
import logging
from pathlib import Path
from delayq import Worker, load_topology

worker = Worker(load_topology(Path(__file__).with_name("delayq.yaml")))
log = logging.getLogger("leakapp")

@worker.handler("{queue}")
def handle(value):
    log.info("handled %s", value["n"])
"""


def wait_for(path: Path, predicate: Any, timeout_s: float = 60) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        if predicate(text):
            return text
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting on {path.name}: {text[-3000:]}")


def test_no_password_in_the_workers_json_logs_or_metrics(secret: Secret, tmp_path: Path) -> None:
    topo = topology()
    queue = f"{topo.namespace}.work"
    (tmp_path / "delayq.yaml").write_text(
        f"namespace: {topo.namespace}\nladder: [1s]\ndestinations:\n"
        f"  - queue: {queue}\n    bindings: [job.#]\n"
    )
    (tmp_path / "leakapp.py").write_text(WORKER_APP.replace("{queue}", queue))
    apply_topology(topo, secret.good)
    out_path, err_path = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    args = ["worker", "leakapp:worker", "--url", secret.good, "--log-level", "debug"]
    args += ["--log-format", "json", "--metrics-port", "0"]
    with out_path.open("w") as out, err_path.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "delayq", *args],
            cwd=tmp_path,
            stdout=out,
            stderr=err,
            env={**os.environ, "PYTHONPATH": SRC, "PYTHONUNBUFFERED": "1"},
        )
    try:
        started = wait_for(out_path, lambda text: "metrics on http://" in text)
        metrics_url = started.split("metrics on ", 1)[1].split()[0]
        with Publisher(secret.good, topo) as pub:
            pub.publish({"n": 7}, "job.a", "0s", message_id="leak-probe")

        def handled(text: str) -> bool:
            return '"message": "handled 7"' in text and '"message_id": "leak-probe"' in text

        wait_for(err_path, handled)
        for _ in range(100):  # the ack, then the observer, follow the handler's line
            with urllib.request.urlopen(metrics_url, timeout=10) as response:
                metrics = response.read().decode()
            if f'delayq_delivered_total{{outcome="ack",queue="{queue}"}} 1.0' in metrics:
                break
            time.sleep(0.1)
        else:
            raise AssertionError(metrics)
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0
    stdout, stderr = out_path.read_text(), err_path.read_text()
    entries = [json.loads(line) for line in stderr.splitlines()]  # every line is JSON
    assert any(e["logger"].startswith("pika") and e["level"] == "DEBUG" for e in entries)
    assert f"{secret.user}:***@" in stdout  # the redacted URL
    [line] = [e for e in entries if e["message"] == "handled 7"]
    assert (line["message_id"], line["queue"], line["routing_key"], line["attempt"]) == (
        "leak-probe",
        queue,
        "job.a",
        1,
    )
    assert secret.password not in stdout + stderr + metrics


# --- a handler's error: DLQ headers, dlq list/show, worker logs, delivery records ----------------

FAILING_APP = """
import os
from pathlib import Path
from delayq import FixedBackoff, Worker, load_topology

SECRET, CUSTOMER = os.environ["LEAK_SECRET"], os.environ["LEAK_CUSTOMER"]
# A scrubber of the application's own, for what delayq cannot know is private.
worker = Worker(
    load_topology(Path(__file__).with_name("delayq.yaml")),
    policy=FixedBackoff(delay="1s", max_attempts=2),
    scrubber=lambda text: text.replace(CUSTOMER, "<customer>"),
)

@worker.handler("{queue}")
def handle(value):
    raise RuntimeError(
        f"order of {CUSTOMER}: cannot connect to postgresql://app:{SECRET}@db/x "
        f"(headers {{'Authorization': 'Bearer {SECRET}'}})"
    )
"""


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_no_secret_from_a_handlers_error_in_dlq_logs_or_records(
    secret: Secret, tmp_path: Path, log_format: str
) -> None:
    """The error text is scrubbed once, before headers, reasons, logs and records see it."""
    topo = topology()
    queue = f"{topo.namespace}.work"
    db_secret, customer = f"db{uuid.uuid4().hex}", f"cust-{uuid.uuid4().hex[:12]}"
    (tmp_path / "delayq.yaml").write_text(
        f"namespace: {topo.namespace}\nladder: [1s]\ndestinations:\n"
        f"  - queue: {queue}\n    bindings: [job.#]\n"
    )
    (tmp_path / "failapp.py").write_text(FAILING_APP.replace("{queue}", queue))
    apply_topology(topo, secret.good)
    records = tmp_path / "records"
    out_path, err_path = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    args = ["worker", "failapp:worker", "--url", secret.good, "--log-level", "debug"]
    args += ["--log-format", log_format, "--records", str(records)]
    env = {
        **os.environ,
        "PYTHONPATH": SRC,
        "PYTHONUNBUFFERED": "1",
        "LEAK_SECRET": db_secret,
        "LEAK_CUSTOMER": customer,
    }
    with out_path.open("w") as out, err_path.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "delayq", *args], cwd=tmp_path, stdout=out, stderr=err, env=env
        )
    try:
        wait_for(out_path, lambda text: "delivery records:" in text)
        with Publisher(secret.good, topo) as pub:
            pub.publish({"n": 1}, "job.a", "0s", message_id="leak-error")
        wait_for(err_path, lambda text: "dead-lettered leak-error" in text)
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0
    logs = out_path.read_text() + err_path.read_text()
    if log_format == "json":
        [json.loads(line) for line in err_path.read_text().splitlines()]  # every line is JSON
    record_text = "".join(p.read_text() for p in sorted(records.glob("*.jsonl")))
    outcomes = [json.loads(line)["outcome"] for line in record_text.splitlines()]
    assert outcomes == ["retry", "dead-letter"], record_text

    listing = run_cli(["dlq", "list", queue, "--url", secret.good, "-f", "delayq.yaml"], tmp_path)
    shown = run_cli(
        ["dlq", "show", queue, "leak-error", "--url", secret.good, "-f", "delayq.yaml"], tmp_path
    )
    assert listing.returncode == 0 and shown.returncode == 0, listing.stderr + shown.stderr
    assert "leak-error" in listing.stdout and "postgresql://app:***@db/x" in shown.stdout

    import pika

    connection = pika.BlockingConnection(pika.URLParameters(secret.good))
    method, props, _body = connection.channel().basic_get(f"{queue}.dlq", auto_ack=False)
    connection.close()
    assert method is not None
    headers = repr(props.headers)
    assert "postgresql://app:***@db/x" in headers and "<customer>" in headers

    everything = "\n".join(
        [logs, record_text, listing.stdout, listing.stderr, shown.stdout, shown.stderr, headers]
    )
    assert "dead-lettered leak-error" in logs  # the reason reached the log, scrubbed
    assert db_secret not in everything
    assert customer not in everything
