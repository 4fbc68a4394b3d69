"""Every python block of the README (and docs/*.md) that needs a server runs against real
ones (see ``tests/readme_examples.py``; blocks needing none run in tests/unit).

Each block gets a virtual host of its own on the session's management node, so the
README's fixed names (namespace ``delayq``, queue ``orders.reminders``) never meet
another test's, with ``topology/delayq.yaml`` applied in it first, as the README
assumes after ``delayq topology apply``. The README's placeholder addresses become
that vhost's URL, the node's management API and throwaway Redis / PostgreSQL servers.
The Spark blocks run in the Spark worker's session (``rx.run_in_session``), the others
as programs of their own.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from delayq import load_topology
from delayq.local.node import LocalNode
from delayq.sync import apply_topology
from tests import readme_examples as rx


def _params() -> list[Any]:
    params = []
    for block in rx.runnable(server=True):
        marks = [getattr(pytest.mark, need) for need in ("spark", "cluster") if need in block.needs]
        if rx.in_session(block):  # on the Spark worker, in its session (tests/spark/conftest.py)
            marks.append(pytest.mark.xdist_group("spark"))
        params.append(pytest.param(block, id=rx.block_id(block), marks=marks))
    return params


class VHost:
    """A virtual host of a management node, with the guest user allowed everything."""

    def __init__(self, node: LocalNode, name: str) -> None:
        assert node.management_url is not None
        parts = urllib.parse.urlsplit(node.management_url)
        self.api = f"http://{parts.hostname}:{parts.port}/api"
        self.name = name
        self.url = f"amqp://guest:guest@127.0.0.1:{node.port}/{urllib.parse.quote(name, safe='')}"
        self.management_url = node.management_url

    def _call(self, method: str, path: str, body: object = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.api}{path}", data=data, method=method)
        request.add_header("content-type", "application/json")
        token = "Basic Z3Vlc3Q6Z3Vlc3Q="  # guest:guest
        request.add_header("authorization", token)
        with urllib.request.urlopen(request, timeout=10) as response:
            text = response.read()
        return json.loads(text) if text else None

    def create(self) -> VHost:
        quoted = urllib.parse.quote(self.name, safe="")
        self._call("PUT", f"/vhosts/{quoted}", {})
        self._call(
            "PUT", f"/permissions/{quoted}/guest", {"configure": ".*", "write": ".*", "read": ".*"}
        )
        return self

    def consumers(self) -> int:
        return len(self._call("GET", f"/consumers/{urllib.parse.quote(self.name, safe='')}"))

    def delete(self) -> None:
        self._call("DELETE", f"/vhosts/{urllib.parse.quote(self.name, safe='')}")


@pytest.fixture
def vhost(local_rabbitmq_management_node: LocalNode) -> Iterator[VHost]:
    host = VHost(local_rabbitmq_management_node, f"readme-{uuid.uuid4().hex[:8]}").create()
    try:
        yield host
    finally:
        host.delete()


@pytest.mark.parametrize("block", _params())
def test_the_block_runs(block: rx.Block, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    urls: dict[str, str] = {}
    host: VHost | None = None
    if "broker" in block.needs:
        host = request.getfixturevalue("vhost")
        urls[rx.AMQP] = host.url
        urls[rx.MANAGEMENT] = host.management_url
        rx.prepare(block, tmp_path, host.name)
        apply_topology(load_topology(tmp_path / "topology" / "delayq.yaml"), host.url)
    else:
        rx.prepare(block, tmp_path)
    if "redis" in block.needs:
        urls[rx.REDIS] = request.getfixturevalue("redis_url")
    if "postgres" in block.needs:
        urls[rx.POSTGRES] = request.getfixturevalue("postgres_dsn")
    if rx.in_session(block):
        message = rx.run_in_session(block, tmp_path, urls, request.getfixturevalue("spark"))
    else:
        consuming = (lambda: host.consumers() > 0) if host is not None else None
        message = rx.run(block, tmp_path, urls, timeout_s=180, consuming=consuming)
    if message is not None:
        pytest.fail(message, pytrace=False)
