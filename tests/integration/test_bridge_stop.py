"""A stop ends a bridge whose stream is stuck (issue 48): confirms that never come (the
broker's memory alarm blocks the publishing connection, or a broker that does not
confirm), or a bridge whose own thread is stuck (closing its connection).

Before, a stop waited for every delivery in flight to be confirmed: with the broker
blocking publishers, for as long as the stream kept reconnecting (minutes), and a worker
then left ``delayq bridge`` unable to exit (its bridge thread was not a daemon). Now a
stop waits ``--stop-grace`` for the confirms, then leaves what is unconfirmed unacked
(back in the intake queue) and exits 1 saying so; a second signal skips the grace; a
bridge stuck in its own thread is left behind once grace and margin are spent. Nothing
confirmed is lost: a bridge run after the alarm clears delivers every message.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import delayq.aio._bridgewire as engine_module
from delayq.errors import PublishUnconfirmed
from delayq.local.node import LocalNode
from delayq.sync import apply_topology
from delayq.sync._bridging import HURRY_MARGIN_S, IO_JOIN_S, STOP_MARGIN_S
from delayq.sync.bridge import Bridge
from tests.amqp import depth
from tests.integration.intake_support import Running, publish_plugin_style
from tests.integration.test_cli_parked import write
from tests.waiting import Lines, wait_for

COUNT = 200

BOUND_S = 30.0
"""A generous bound for "it did not hang": the grace and margins of the tests are a few
seconds; a loaded machine gets the rest."""


def _topology(make_topology: Any) -> Any:
    ns = make_topology().namespace
    return make_topology(
        ladder=["1s"],
        destinations=[{"queue": f"{ns}x.work", "bindings": ["job.a"]}],
        intakes=[{"exchange": f"plugin-{ns}", "type": "direct"}],
    )


def _publish(url: str, topology: Any) -> set[str]:
    messages = [
        {"id": f"s-{n}", "routing_key": "job.a", "body": b"{}", "headers": {"x-delay": 0}}
        for n in range(COUNT)
    ]
    publish_plugin_style(url, topology.intakes[0].exchange, messages)
    return {m["id"] for m in messages}


def _unacked(node: LocalNode, queue: str) -> int:
    rows = node.ctl("list_queues", "name", "messages_unacknowledged", "--no-table-headers", "-q")
    for row in rows.splitlines():
        name, _, count = row.partition("\t")
        if name == queue:
            return int(count)
    return 0


def _blocked(node: LocalNode) -> bool:
    """Whether the bridge's connection (it publishes) is blocked by the alarm."""
    rows = node.ctl("list_connections", "client_properties", "state", "--no-table-headers", "-q")
    return any("delayq-bridge " in row and "blocked" in row for row in rows.splitlines())


def _alarm(node: LocalNode, on: bool) -> None:
    node.ctl("set_vm_memory_high_watermark", "0.000001" if on else "0.4")
    wait_for(
        lambda: ("memory" in node.ctl("eval", "rabbit_alarm:get_alarms().")) == on,
        30,
        f"the memory alarm to {'rise' if on else 'clear'}",
        interval_s=0.2,
    )


@pytest.fixture
def alarmed(local_rabbitmq_node: LocalNode) -> Iterator[LocalNode]:
    """The node with its memory alarm raised (cleared afterwards, whatever happens)."""
    _alarm(local_rabbitmq_node, on=True)
    try:
        yield local_rabbitmq_node
    finally:
        _alarm(local_rabbitmq_node, on=False)


def _all_arrive(url: str, topology: Any, collect: Any, ids: set[str]) -> None:
    """A fresh bridge delivers every message: nothing was lost by the stop."""
    arrived = collect(topology.destinations[0].queue, url=url)
    queue = topology.intakes[0].queue_name(topology.namespace)
    running = Running(Bridge(url, topology, prefetch=100))
    try:  # what was published but not confirmed arrives twice: the intake queue drained
        wait_for(
            lambda: ids <= {a.message_id for a in arrived.arrivals} and depth(url, queue) == 0,
            120,
            lambda: (
                f"{len({a.message_id for a in arrived.arrivals})} of {len(ids)} arrived, "
                f"{depth(url, queue)} in {queue}"
            ),
        )
    finally:
        running.stop()
    assert depth(url, queue) == 0
    assert depth(url, topology.intakes[0].dlq_name(topology.namespace)) == 0


def _blocked_bridge(
    node: LocalNode, make_topology: Any, tmp_path: Path, grace: str
) -> tuple[Any, set[str], subprocess.Popen[str]]:
    """``delayq bridge`` (``--stop-grace grace``) over an intake of published messages,
    its forwards blocked by the node's memory alarm: the topology, the ids, the process
    (text pipes; its first line read), once it holds deliveries it cannot get confirmed."""
    url = node.url
    topology = _topology(make_topology)
    apply_topology(topology, url)
    queue = topology.intakes[0].queue_name(topology.namespace)
    _alarm(node, on=False)  # the publisher of the test is not blocked
    ids = _publish(url, topology)
    _alarm(node, on=True)
    line = ["bridge", "--file", str(write(topology, tmp_path)), "--url", url]
    command = subprocess.Popen(
        [sys.executable, "-m", "delayq", *line, "--stop-grace", grace],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert command.stdout is not None and command.stderr is not None
        assert command.stdout.readline().startswith("delayq bridge: ")
        wait_for(
            lambda: _unacked(node, queue) > 0 and _blocked(node),
            60,
            lambda: f"{_unacked(node, queue)} unacked in {queue}, blocked: {_blocked(node)}",
            interval_s=0.2,
        )
    except BaseException:
        command.kill()
        command.wait(10)
        raise
    return topology, ids, command


@pytest.mark.parametrize("signals", [["SIGTERM"], ["SIGINT", "SIGINT"]])
def test_a_bridge_blocked_by_a_memory_alarm_exits_on_a_signal_and_loses_nothing(
    alarmed: LocalNode, make_topology: Any, collect: Any, tmp_path: Path, signals: list[str]
) -> None:
    node = alarmed
    url = node.url
    # One signal waits the grace (2 s); two skip it, however long (1 h).
    grace = "2s" if len(signals) == 1 else "1h"
    topology, ids, command = _blocked_bridge(node, make_topology, tmp_path, grace)
    queue = topology.intakes[0].queue_name(topology.namespace)
    assert command.stderr is not None
    said = Lines(command.stderr)
    try:
        signalled = time.monotonic()
        command.send_signal(getattr(signal, signals[0]))
        if len(signals) > 1:  # once the first is heard: two signals, not one
            said.until(f"bridge of {queue} stopping: up to 3600 s", timeout_s=BOUND_S)
            command.send_signal(getattr(signal, signals[1]))
        command.wait(BOUND_S)
        took_s = time.monotonic() - signalled
        err = said.ended(BOUND_S)
    finally:
        command.kill()
        command.wait(10)
    assert command.returncode == 1, err
    assert "Traceback" not in err
    assert f"the bridge of {queue} stopped with" in err
    assert "deliveries unconfirmed" in err and "nothing confirmed was lost" in err
    assert took_s < BOUND_S
    wait_for(lambda: _unacked(node, queue) == 0, 30, "the deliveries back in the queue")
    assert depth(url, queue) > 0
    _alarm(node, on=False)
    _all_arrive(url, topology, collect, ids)


def test_a_sighup_whose_stop_leaves_deliveries_unconfirmed_starts_the_bridges_again(
    alarmed: LocalNode, make_topology: Any, collect: Any, tmp_path: Path
) -> None:
    """A reload's stop that had to leave deliveries unconfirmed (a broker blocking
    publishers) puts them back in the intake queue, and the bridges start again: the
    process had exited 1, and with no supervisor nothing was bridged after it (outside
    tester, a frozen broker)."""
    node = alarmed
    url = node.url
    topology, ids, command = _blocked_bridge(node, make_topology, tmp_path, "1s")
    queue = topology.intakes[0].queue_name(topology.namespace)
    try:
        assert command.stderr is not None
        command.send_signal(signal.SIGHUP)
        said = []
        for said_line in command.stderr:  # ends at the process's end, if it ends
            said.append(said_line)
            if "worker running" in said_line and any("starting them again" in x for x in said):
                break
        assert command.poll() is None, "".join(said)
        arrived = collect(topology.destinations[0].queue, url=url)
        _alarm(node, on=False)
        wait_for(
            lambda: ids <= {a.message_id for a in arrived.arrivals},
            120,
            lambda: f"{len({a.message_id for a in arrived.arrivals})} of {len(ids)} arrived",
        )
        command.send_signal(signal.SIGTERM)
        _out, err = command.communicate(timeout=BOUND_S)
    finally:
        command.kill()
        command.wait(10)
    assert command.returncode == 0, "".join(said) + err
    assert depth(url, queue) == 0


def test_request_stop_ends_a_bridge_whose_confirms_never_come(
    rabbitmq_url: str, make_topology: Any, collect: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    topology = _topology(make_topology)
    apply_topology(topology, rabbitmq_url)
    ids = _publish(rabbitmq_url, topology)
    stuck = threading.Event()

    def never(self: Any, token: int, acked: bool, returned: bool) -> None:
        stuck.set()  # the confirm is lost: its delivery waits for it for good

    monkeypatch.setattr(engine_module.WireBridge, "settled", never)
    bridge = Bridge(rabbitmq_url, topology, prefetch=50, stop_grace="1s")
    raised: list[BaseException] = []

    def run() -> None:
        try:
            bridge.run(install_signal_handlers=False)
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        wait_for(stuck.is_set, 60, "a confirm lost")
        stopped = time.monotonic()
        bridge.request_stop()
        thread.join(BOUND_S)
        took_s = time.monotonic() - stopped
        assert not thread.is_alive(), "the bridge did not stop"
    finally:
        thread.join(BOUND_S)
    assert took_s < bridge.stop_grace_s + 2 * IO_JOIN_S + STOP_MARGIN_S
    [error] = raised
    assert isinstance(error, PublishUnconfirmed)
    assert "deliveries unconfirmed after its 1 s stop grace" in str(error)
    assert bridge.stats.abandoned > 0 and bridge.stats.forwarded == 0
    monkeypatch.undo()
    _all_arrive(rabbitmq_url, topology, collect, ids)


HOOK = textwrap.dedent(
    """
    import faulthandler, os, signal, sys, threading

    import delayq.aio._bridgewire as engine_module

    faulthandler.register(signal.SIGUSR1, all_threads=True)  # a hung test asks where

    def stuck(what):
        print(f"hook: stuck in {what}", file=sys.stderr, flush=True)
        threading.Event().wait()  # never returns

    def lost(self, token, acked, returned):  # confirms that never come
        print("hook: stuck without confirms", file=sys.stderr, flush=True)

    async def closing(self, *wires):  # the bridge's own thread, stuck closing
        stuck("a close")

    if os.environ["DELAYQ_TEST_STUCK"] == "confirms":
        engine_module.WireBridge.settled = lost
    else:
        engine_module.WireBridge._close = closing
    """
)


def _until(command: subprocess.Popen[str], said: Lines, *parts: str) -> None:
    """Wait for the bridge to say ``parts``; hung, it is asked for its threads' stacks
    (the hook's ``faulthandler``), which the failure shows."""
    try:
        said.until(*parts, timeout_s=BOUND_S)
    except AssertionError:
        command.send_signal(signal.SIGUSR1)
        with contextlib.suppress(AssertionError):
            said.until("Thread 0x", timeout_s=5)
        command.kill()
        raise AssertionError(f"the bridge never said {list(parts)}:\n{said.ended(10)}") from None


@pytest.mark.parametrize("where", ["confirms", "close", "close, hurried"])
def test_delayq_bridge_stuck_exits_within_grace_and_margin(
    rabbitmq_url: str, make_topology: Any, collect: Any, tmp_path: Path, where: str
) -> None:
    """Without confirms, the bridge gives up on what is in flight after its grace. Stuck
    itself (closing its connection), the worker stops waiting for it after
    its grace and :data:`STOP_MARGIN_S`, or :data:`HURRY_MARGIN_S` after a second signal
    (a grace of an hour: it waited all of it, an outside tester's broker frozen). Either
    way the process exits 1, saying why."""
    hurried = where == "close, hurried"
    topology = _topology(make_topology)
    apply_topology(topology, rabbitmq_url)
    ids = _publish(rabbitmq_url, topology)
    (tmp_path / "sitecustomize.py").write_text(HOOK)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path]),
        "DELAYQ_TEST_STUCK": where.split(",")[0],
    }
    line = ["bridge", "--file", str(write(topology, tmp_path)), "--url", rabbitmq_url]
    command = subprocess.Popen(
        [sys.executable, "-m", "delayq", *line, "--stop-grace", "1h" if hurried else "1s"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert command.stdout is not None and command.stderr is not None
    said = Lines(command.stderr)
    try:
        assert command.stdout.readline().startswith("delayq bridge: ")
        awaited = ["worker running"] + (["hook: stuck"] if where == "confirms" else [])
        _until(command, said, *awaited)  # running (its signal handlers in place), and stuck
        command.send_signal(signal.SIGTERM)
        if hurried:  # stuck closing (the hook says so), then a second signal
            _until(command, said, "hook: stuck")
            command.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        command.wait(BOUND_S)
        took_s = time.monotonic() - signalled
        err = said.ended(BOUND_S)
    finally:
        command.kill()
        command.wait(10)
    assert command.returncode == 1, err
    assert "Traceback" not in err
    queue = topology.intakes[0].queue_name(topology.namespace)
    if where == "confirms":
        assert f"the bridge of {queue} stopped with" in err
        assert "deliveries unconfirmed after its 1 s stop grace" in err
    elif hurried:
        assert f"did not stop within {HURRY_MARGIN_S:g} s of the second stop" in err, err
    else:
        assert f"the bridge of {queue} did not stop within {1 + STOP_MARGIN_S:g} s" in err
    assert took_s < (HURRY_MARGIN_S if hurried else 1 + STOP_MARGIN_S) + 5
    _all_arrive(rabbitmq_url, topology, collect, ids)
