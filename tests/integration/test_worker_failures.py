"""`delayq worker` that cannot connect exits 1 with one line (issue 12, item 7).

Before the fix a worker with sync handlers printed "worker running", a traceback and
"worker stopped", then exited 0: a supervisor read that as a clean stop.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
import yaml

SYNC = """
@worker.handler("{ns}.work")
def plain(value):
    pass
"""
ASYNC = """
@worker.handler("{ns}.other")
async def coroutine(value):
    pass
"""
HEAD = """
from pathlib import Path
from delayq import Worker, load_topology

worker = Worker(load_topology(Path(__file__).with_name("topology.yaml")))
"""
KINDS = {"sync": SYNC, "async": ASYNC, "both": SYNC + ASYNC}


def write_app(tmp_path: Path, kind: str) -> str:
    ns = f"w{uuid.uuid4().hex[:10]}"  # never applied: the worker cannot connect
    topology = {
        "namespace": ns,
        "ladder": ["1s"],
        "destinations": [
            {"queue": f"{ns}.work", "bindings": ["work.#"]},
            {"queue": f"{ns}.other", "bindings": ["other.#"]},
        ],
    }
    (tmp_path / "topology.yaml").write_text(yaml.safe_dump(topology))
    (tmp_path / "failapp.py").write_text(HEAD + textwrap.dedent(KINDS[kind]).replace("{ns}", ns))
    return "failapp"


def worker(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "delayq", "worker", *argv],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=90,
    )


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("broker", ["wrong-password", "dead-port"])
def test_a_worker_that_cannot_connect_exits_1_with_one_line(kind, broker, rabbitmq_url, tmp_path):
    if broker == "wrong-password":
        user = rabbitmq_url.split("//", 1)[1].split(":", 1)[0]
        url = rabbitmq_url.replace(f"//{user}:", f"//{user}:wrong-secret-", 1)
        expected = "refused the credentials"
    else:
        url = "amqp://guest:wrong-secret@127.0.0.1:1/"
        expected = "cannot connect"
    run = worker(tmp_path, write_app(tmp_path, kind), "--url", url)
    assert run.returncode == 1, run.stdout + run.stderr
    [line] = run.stderr.splitlines()
    assert line.startswith("delayq: error: ") and expected in line, run.stderr
    assert "Traceback" not in run.stderr and "wrong-secret" not in run.stderr + run.stdout
    assert "worker running" not in run.stdout + run.stderr


def test_the_traceback_is_there_at_debug_level(tmp_path):
    run = worker(
        tmp_path,
        write_app(tmp_path, "sync"),
        "--url",
        "amqp://guest:x@127.0.0.1:1/",
        "--log-level",
        "debug",
    )
    assert run.returncode == 1
    assert "Traceback" in run.stderr
    # pika's address resolver thread logs "added callback" after handing its result
    # over, so on a loaded machine its line can come after everything else: the error
    # is the last line that is not a client library's debug record.
    ours = [line for line in run.stderr.splitlines() if " DEBUG pika." not in line]
    assert ours[-1].startswith("delayq: error: cannot connect"), run.stderr[-2000:]


def test_worker_run_raises_when_a_sync_consumer_cannot_connect(rabbitmq_url):
    """The API, not only the CLI: before the fix `Worker.run` returned as if stopped."""
    import threading

    from delayq import Topology, Worker
    from delayq.errors import ConnectionFailed

    ns = f"w{uuid.uuid4().hex[:10]}"
    app = Worker(
        Topology(
            namespace=ns,
            ladder=["1s"],
            destinations=[{"queue": f"{ns}.work", "bindings": ["job.#"]}],
        )
    )
    app.handler(f"{ns}.work")(lambda value: None)
    user = rabbitmq_url.split("//", 1)[1].split(":", 1)[0]
    url = rabbitmq_url.replace(f"//{user}:", f"//{user}:wrong-", 1)
    with pytest.raises(ConnectionFailed, match="refused the credentials"):
        app.run(url, stop=threading.Event())
