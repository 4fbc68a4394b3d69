"""Ctrl-C on ``delayq publish`` once it is connected (issue 48, item 2).

A ``sitecustomize`` hook stops the command at a chosen point of its send, prints a
marker and waits; the test sends SIGINT once it reads the marker (a state, not a
sleep). Before: "interrupted", exit 130, no id, though in 5 of 14 runs the message
was in its tier. Now the id is chosen before anything is sent and named in the error
with the ways to check, withdraw or re-publish it idempotently.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pika
import pytest

from delayq.sync import apply_topology
from tests.integration.test_cli_parked import write

HOOK = textwrap.dedent(
    """
    import os, signal, sys

    import delayq.sync.publisher as publisher

    sends = publisher.ThreadSafeSends
    original = sends.send
    point = os.environ["DELAYQ_TEST_STOP"]

    def send(self, msg):
        if point == "connected":
            self.connect()
        else:
            original(self, msg)  # confirmed by the broker: in its tier
        print(f"hook: {point}", file=sys.stderr, flush=True)
        signal.pause()  # until the test's SIGINT raises KeyboardInterrupt here

    sends.send = send
    """
)


def in_tier(url: str, queue: str) -> list[str]:
    """Message ids in ``queue``, left in place."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        ids = []
        while True:
            method, props, _ = channel.basic_get(queue, auto_ack=False)
            if method is None:
                break
            ids.append(props.message_id)
        channel.basic_nack(0, multiple=True, requeue=True)
        return ids
    finally:
        connection.close()


@pytest.mark.parametrize("point", ["connected", "sent"])
def test_an_interrupted_publish_names_the_message_id_and_how_to_stay_idempotent(
    point: str, make_topology, rabbitmq_url: str, tmp_path: Path
) -> None:
    topology = make_topology(["1h"])
    apply_topology(topology, rabbitmq_url)
    ns, path = topology.namespace, write(topology, tmp_path)
    (tmp_path / "sitecustomize.py").write_text(HOOK)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path]),
        "DELAYQ_TEST_STOP": point,
    }
    line = ["publish", "-k", "job.1", "-d", "1h", "--file", str(path), "--url", rabbitmq_url]
    command = subprocess.Popen(
        [sys.executable, "-m", "delayq", *line],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert command.stderr is not None
        assert command.stderr.readline() == f"hook: {point}\n"
        command.send_signal(signal.SIGINT)
        out, err = command.communicate(timeout=60)
    finally:
        command.kill()
    assert command.returncode == 130, err
    assert "Traceback" not in err and out == ""
    [message_id] = re.findall(r"message ([0-9a-f]{32}) may or may not have been published", err)
    assert f"--message-id {message_id}" in err and "delayq cancel" in err
    tier = f"{ns}.tier.1h"
    assert in_tier(rabbitmq_url, tier) == ([message_id] if point == "sent" else [])

    again = subprocess.run(
        [sys.executable, "-m", "delayq", *line, "--message-id", message_id, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert again.returncode == 0, again.stderr
    assert f'"message_id": "{message_id}"' in again.stdout


AFTER = textwrap.dedent(
    """
    import os, signal

    import delayq.cli.run as run

    original = run._print_receipt

    def print_receipt(args, receipt):
        os.kill(os.getpid(), signal.SIGINT)  # a Ctrl-C once the publish returned
        original(args, receipt)

    run._print_receipt = print_receipt
    """
)


def test_a_ctrl_c_once_the_message_is_published_still_prints_its_receipt_and_exits_0(
    make_topology, rabbitmq_url: str, tmp_path: Path
) -> None:
    """The outcome is known: the receipt is the truth, not "interrupted" (exit 130), which
    a script reads as a failure and publishes again."""
    topology = make_topology(["1h"])
    apply_topology(topology, rabbitmq_url)
    ns, path = topology.namespace, write(topology, tmp_path)
    (tmp_path / "sitecustomize.py").write_text(AFTER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    line = ["publish", "-k", "job.1", "-d", "1h", "--file", str(path), "--url", rabbitmq_url]
    done = subprocess.run(
        [sys.executable, "-m", "delayq", *line, "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    [message_id] = re.findall(r'"message_id": "([0-9a-f]{32})"', done.stdout)
    assert in_tier(rabbitmq_url, f"{ns}.tier.1h") == [message_id]
