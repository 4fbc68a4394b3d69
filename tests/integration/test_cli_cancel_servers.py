"""`delayq cancel` / `delayq reschedule` with `--store redis://...` and
`--store postgresql://...` against real servers and a real broker (issue 15's CLI).

A sync consumer uses a RedisStore or a PostgresStore on the very server the command
names (the store's default prefix or table, as the command's): of two parked messages,
one is cancelled and one rescheduled earlier with a new body through the command line;
the consumer skips the cancelled one and the old copy as cancelled and handles the new
copy once. Then bad store URLs: an unknown scheme, a database that does not exist, an
unreachable port: each a clear error, non-zero exit, no traceback, no password.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from typing import Any

import pytest
import yaml

from delayq.sync import Consumer, Publisher, apply_topology
from tests.integration.conftest import SyncConsumerHandle
from tests.integration.store_servers import client_module
from tests.waiting import wait_for


def _delayq(
    *args: str, timeout: float = 60, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "delayq", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def _open(kind: str, where: str) -> Any:
    """The store a consumer would use with the command's defaults (prefix, table)."""
    if kind == "redis":
        client_module("redis", "redis")
        from delayq.stores.redis import RedisStore

        return RedisStore(where)
    client_module("psycopg", "postgres")
    from delayq.stores.postgres import PostgresStore

    return PostgresStore(where)


@pytest.mark.parametrize("kind", ["redis", "postgres"])
def test_cli_marks_land_where_a_consumer_with_that_store_sees_them(
    kind, request, make_topology, rabbitmq_url, tmp_path
):
    where = request.getfixturevalue("redis_url" if kind == "redis" else "postgres_dsn")
    topology = make_topology(["1s", "30s"])  # time for the commands (seconds each here)
    queue = f"{topology.namespace}.work"
    apply_topology(topology, rabbitmq_url)
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(topology.model_dump(mode="json")))
    marks = ["--file", str(path), "--store", where]  # a cancel takes no --url
    common = [*marks, "--url", rabbitmq_url]
    run = uuid.uuid4().hex[:8]
    cancelled, moved = f"cancelled-{run}", f"moved-{run}"
    store = _open(kind, where)
    handled: list[Any] = []
    handle = SyncConsumerHandle(
        Consumer(rabbitmq_url, topology, queue, handled.append, store=store)
    )
    try:
        with Publisher(rabbitmq_url, topology) as publisher:
            for message_id in (cancelled, moved):
                publisher.publish({"id": message_id}, "job.x", "30s", message_id=message_id)
        cancel = _delayq("cancel", "--message-id", cancelled, "--json", *marks)
        assert cancel.returncode == 0, cancel.stderr
        [receipt] = json.loads(cancel.stdout)["receipts"]
        assert receipt["queues"] == {queue: "unknown"}
        again = _delayq("cancel", "--message-id", cancelled, "--json", *marks)
        assert json.loads(again.stdout)["receipts"][0]["status"] == "already cancelled"
        resched = _delayq(
            "reschedule", "--message-id", moved, "--delay", "1s",
            "--body", '{"id": "new"}', "-k", "job.x", "--json", *common,
        )  # fmt: skip
        assert resched.returncode == 0, resched.stderr
        assert json.loads(resched.stdout)["moved"] is True
        wait_for(lambda: handle.stats.handled == 1, 30, "the rescheduled copy handled")
        wait_for(lambda: handle.stats.cancelled == 2, 90, "the cancelled and the old copy skipped")
    finally:
        handle.stop(10)
        store.close()
    assert handled == [{"id": "new"}]
    assert (handle.stats.handled, handle.stats.cancelled) == (1, 2)


def _bad(store_url: str, rabbitmq_url: str, path: str) -> subprocess.CompletedProcess[str]:
    # a cancel takes no --url (it marks the store only): $DELAYQ_URL is no matter either
    env = {**os.environ, "DELAYQ_URL": rabbitmq_url}
    return _delayq("cancel", "--message-id", "m-1", "--store", store_url, "--file", path, env=env)


@pytest.fixture
def topology_file(make_topology, tmp_path) -> str:
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(make_topology().model_dump(mode="json")))
    return str(path)


@pytest.mark.parametrize(
    ("store_url", "code", "said"),
    [
        ("mysql://u:sekrit@127.0.0.1/db", 2, "is not a store URL"),
        ("sqlite:///", 2, "names no file"),
        ("redis://:sekrit@127.0.0.1:1/0", 1, "cannot open the store at redis://"),
        ("postgresql://u:sekrit@127.0.0.1:1/db", 1, "cannot open the store at postgresql://"),
    ],
)
def test_bad_store_urls_are_clear_errors(store_url, code, said, topology_file, rabbitmq_url):
    done = _bad(store_url, rabbitmq_url, topology_file)
    assert done.returncode == code, done.stderr
    assert said in done.stderr
    assert "sekrit" not in done.stderr + done.stdout and "Traceback" not in done.stderr


def test_a_redis_database_out_of_range_is_a_clear_error(redis_url, topology_file, rabbitmq_url):
    client_module("redis", "redis")
    done = _bad(redis_url.rsplit("/", 1)[0] + "/999", rabbitmq_url, topology_file)
    assert done.returncode == 1, done.stderr
    assert "cannot open the store" in done.stderr and "Traceback" not in done.stderr


def test_a_database_that_does_not_exist_is_a_clear_error(postgres_dsn, topology_file, rabbitmq_url):
    client_module("psycopg", "postgres")
    missing = postgres_dsn.rsplit("/", 1)[0] + f"/nodb_{uuid.uuid4().hex[:8]}"
    done = _bad(missing, rabbitmq_url, topology_file)
    assert done.returncode == 1, done.stderr
    assert "does not exist" in done.stderr and "Traceback" not in done.stderr
    resched = _delayq(
        "reschedule", "--message-id", "m-1", "--delay", "1s", "--body", "{}", "-k", "job.x",
        "--store", missing, "--file", topology_file, "--url", rabbitmq_url,
    )  # fmt: skip
    assert resched.returncode == 1 and "does not exist" in resched.stderr
