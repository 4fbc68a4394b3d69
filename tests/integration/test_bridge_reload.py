"""SIGHUP makes ``delayq bridge`` read its topology file again: a key parked as unbound
by a running bridge is delivered by a replay once the binding is added, applied and the
bridge told so (an outside tester's replay did nothing while the bridge kept the
topology it had started with). A file refused on reload leaves the bridges as they were."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from delayq import Topology
from delayq.sync import apply_topology, delete_topology
from tests.amqp import depth
from tests.integration.intake_support import one_intake, publish_plugin_style
from tests.integration.ops import delayq
from tests.waiting import wait_for


def _said(path: Path, text: str, times: int = 1) -> bool:
    return path.read_text(errors="replace").count(text) >= times


def _together(command: subprocess.Popen[bytes], signals: list[signal.Signals]) -> None:
    """``signals`` sent while the process is held stopped, so they land together: sent one
    after the other to a running process, the first could be handled to its end (a reload
    done) before the second came, when the test's process was not scheduled between them."""
    os.kill(command.pid, signal.SIGSTOP)
    wait_for(lambda: _state(command.pid) in ("T", "t"), 10, "the bridge held stopped")
    for sig in signals:
        command.send_signal(sig)
    os.kill(command.pid, signal.SIGCONT)


def _state(pid: int) -> str:
    """A process's state letter from ``/proc`` (``T``: stopped)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


def _bridged(
    rabbitmq_url: str, make_topology: Any, tmp_path: Path
) -> tuple[Topology, Path, Path, Path, subprocess.Popen[bytes]]:
    """A topology with one intake binding ``job.a``, applied, its file, and ``delayq
    bridge`` running on it (its stdout and stderr files), once it says so."""
    ns = make_topology().namespace
    topology = make_topology(
        ladder=["1s"],
        destinations=[{"queue": f"{ns}x.work", "bindings": ["job.a"]}],
        intakes=[{"exchange": f"plugin-{ns}", "type": "direct"}],
    )
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(topology.model_dump(mode="json")))
    apply_topology(topology, rabbitmq_url)
    out, err = tmp_path / "out.txt", tmp_path / "err.txt"
    with out.open("w") as stdout, err.open("w") as stderr:
        command = subprocess.Popen(
            [sys.executable, "-m", "delayq", "bridge", "-f", str(path), "--url", rabbitmq_url],
            stdout=stdout, stderr=stderr,
        )  # fmt: skip
    try:
        wait_for(lambda: _said(err, "worker running"), 60, lambda: err.read_text())
    except BaseException:
        command.kill()
        command.wait(30)
        raise
    return topology, path, out, err, command


def test_sighup_rereads_the_file_and_a_replay_then_delivers(
    rabbitmq_url: str, make_topology: Any, tmp_path: Path
) -> None:
    first, path, out, err, command = _bridged(rabbitmq_url, make_topology, tmp_path)
    ns = first.destinations[0].queue.removesuffix("x.work")
    intake = first.intakes[0]
    queue, dlq = intake.queue_name(first.namespace), intake.dlq_name(first.namespace)
    try:
        message = {"id": "later-b", "routing_key": "job.b", "body": b"{}",
                   "headers": {"x-delay": 0}}  # fmt: skip
        publish_plugin_style(rabbitmq_url, intake.exchange, [message])
        wait_for(lambda: depth(rabbitmq_url, dlq) == 1, 30, f"job.b parked in {dlq}")
        # the operator binds job.b, applies, tells the bridge; a bad file first: kept as is
        path.write_text("namespace: [")
        command.send_signal(signal.SIGHUP)
        wait_for(lambda: _said(err, "refused, the bridges go on"), 60, lambda: err.read_text())
        wait_for(lambda: _said(err, "worker running", 2), 60, lambda: err.read_text())
        second = Topology.model_validate(
            {**first.model_dump(),
             "destinations": [{"queue": f"{ns}x.work", "bindings": ["job.a", "job.b"]}]}
        )  # fmt: skip
        path.write_text(yaml.safe_dump(second.model_dump(mode="json")))
        apply_topology(second, rabbitmq_url)
        command.send_signal(signal.SIGHUP)
        wait_for(lambda: _said(out, "read again"), 60, lambda: out.read_text() + err.read_text())
        wait_for(lambda: _said(err, "worker running", 3), 60, lambda: err.read_text())
        replay = delayq("dlq", "replay", queue, "--all", "-f", str(path), "--url", rabbitmq_url)
        assert replay.returncode == 0, replay.stdout + replay.stderr
        wait_for(lambda: depth(rabbitmq_url, f"{ns}x.work") == 1, 30, "job.b delivered")
        assert depth(rabbitmq_url, dlq) == 0
        # a file that loads but cannot be bridged (an intake not applied yet): the bridges
        # go back to the file as it was, and go on (they died with exit 1: outside tester)
        third = Topology.model_validate(
            {**second.model_dump(),
             "intakes": [*second.model_dump()["intakes"], {"exchange": f"later-{ns}"}]}
        )  # fmt: skip
        path.write_text(yaml.safe_dump(third.model_dump(mode="json")))
        command.send_signal(signal.SIGHUP)
        wait_for(lambda: _said(err, "cannot be bridged"), 60, lambda: err.read_text())
        wait_for(lambda: _said(err, "worker running", 4), 60, lambda: err.read_text())
        assert command.poll() is None, err.read_text()
        again = {"id": "after-bad", "routing_key": "job.a", "body": b"{}",
                 "headers": {"x-delay": 0}}  # fmt: skip
        publish_plugin_style(rabbitmq_url, intake.exchange, [again])
        wait_for(lambda: depth(rabbitmq_url, f"{ns}x.work") == 2, 30, "delivered after it")
        command.send_signal(signal.SIGTERM)
        assert command.wait(60) == 0, err.read_text()
    finally:
        command.kill()
        command.wait(30)
        delete_topology(first, rabbitmq_url)  # the same namespace as the later files


def test_a_sighup_while_the_broker_is_down_waits_for_it(tmp_path: Path) -> None:
    """A SIGHUP with the broker away (a restart): the bridges' new start waits for it and
    goes on, where it gave up after three tries and the process exited 1 (outside tester:
    3 of 3, thousands left in the intake until a new bridge ran)."""
    from delayq.local.node import LocalNode

    node = LocalNode(tmp_path / "node")
    node.start()
    try:
        ns = f"h{tmp_path.name[-6:].replace('-', '')}"
        topology = one_intake(ns)
        path = tmp_path / "t.yaml"
        path.write_text(yaml.safe_dump(topology.model_dump(mode="json")))
        apply_topology(topology, node.url)
        out, err = tmp_path / "out.txt", tmp_path / "err.txt"
        with out.open("w") as stdout, err.open("w") as stderr:
            command = subprocess.Popen(
                [sys.executable, "-m", "delayq", "bridge", "-f", str(path), "--url", node.url],
                stdout=stdout, stderr=stderr,
            )  # fmt: skip
        try:
            wait_for(lambda: _said(err, "worker running"), 60, lambda: err.read_text())
            node.stop()
            command.send_signal(signal.SIGHUP)
            wait_for(lambda: _said(err, "trying again"), 120, lambda: err.read_text())
            node.start()
            wait_for(lambda: _said(err, "worker running", 2), 120, lambda: err.read_text())
            assert command.poll() is None, err.read_text()
            message = {"id": "after", "routing_key": "job.a", "body": b"{}",
                       "headers": {"x-delay": 0}}  # fmt: skip
            publish_plugin_style(node.url, topology.intakes[0].exchange, [message])
            wait_for(lambda: depth(node.url, f"{ns}x.work") == 1, 30, "delivered")
            command.send_signal(signal.SIGTERM)
            assert command.wait(60) == 0, err.read_text()
        finally:
            command.kill()
            command.wait(30)
    finally:
        node.cleanup()


@pytest.mark.parametrize("first", ["SIGHUP", "SIGTERM"])
def test_a_stop_and_a_reload_together_stop_for_good_once(
    rabbitmq_url: str, make_topology: Any, tmp_path: Path, first: str
) -> None:
    """SIGHUP and SIGTERM within moments of each other, either order, with deliveries in
    flight: one graceful stop, exit 0, no reload after it, nothing lost (the SIGTERM had
    counted as a second stop and the bridges gave up their grace: exit 1; and the reload
    went on after it)."""
    topology, _path, out, err, command = _bridged(rabbitmq_url, make_topology, tmp_path)
    ns = topology.destinations[0].queue.removesuffix("x.work")
    intake = topology.intakes[0]
    queue = intake.queue_name(topology.namespace)
    try:
        messages = [{"id": f"m{i}", "routing_key": "job.a", "body": b"{}",
                     "headers": {"x-delay": 0}} for i in range(2000)]  # fmt: skip
        publish_plugin_style(rabbitmq_url, intake.exchange, messages)
        if first == "SIGHUP":  # the two land together (a reload done before the stop came
            _together(command, [signal.SIGHUP, signal.SIGTERM])  # is a reload, then a stop)
        else:  # whenever the SIGHUP lands after the stop began, nothing is read again
            command.send_signal(signal.SIGTERM)
            command.send_signal(signal.SIGHUP)
        assert command.wait(60) == 0, err.read_text()
        assert not _said(out, "read again"), out.read_text()
        assert not _said(err, "worker running", 2), err.read_text()
        wait_for(lambda: depth(rabbitmq_url, f"{ns}x.work") + depth(rabbitmq_url, queue) == 2000,
                 30, lambda: f"2000 in {ns}x.work and {queue}")  # fmt: skip
    finally:
        command.kill()
        command.wait(30)
        delete_topology(topology, rabbitmq_url)


def test_a_signal_just_after_the_stop_changes_nothing(
    rabbitmq_url: str, make_topology: Any, tmp_path: Path
) -> None:
    """A SIGHUP a moment after a SIGTERM's stop, as the process ends: exit 0, not killed
    by that signal (its handlers were the defaults again then: an outside tester's
    second signal 10 to 50 ms late ended it by the signal every time)."""
    topology, _path, _out, err, command = _bridged(rabbitmq_url, make_topology, tmp_path)
    try:
        command.send_signal(signal.SIGTERM)
        wait_for(lambda: _said(err, "worker stopped"), 60, lambda: err.read_text())
        for late in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
            if command.poll() is None:
                command.send_signal(late)
        assert command.wait(60) == 0, err.read_text()
    finally:
        command.kill()
        command.wait(30)
        delete_topology(topology, rabbitmq_url)
