"""`delayq --url X COMMAND` acts on X, never on $DELAYQ_URL (issue 12, item 6).

Before the fix a --url (or --file) before the command was overwritten by the
sub-command's default: `delayq --url <dead> publish` published to the live broker
named by $DELAYQ_URL and exited 0, and a `dlq purge` could empty the wrong DLQ.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from delayq.message.factory import MessageFactory
from delayq.sync import Publisher, apply_topology
from tests.amqp import depth
from tests.waiting import wait_for

DEAD = "amqp://guest:dead-secret@127.0.0.1:1/"


def run(env_url: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "delayq", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "DELAYQ_URL": env_url},
    )


def assert_refused_here(run_: subprocess.CompletedProcess[str]) -> None:
    assert run_.returncode == 1, run_.stdout + run_.stderr
    [line] = run_.stderr.splitlines()
    assert line.startswith("delayq: error: ") and "127.0.0.1:1/" in line
    assert "dead-secret" not in run_.stderr


def test_publish_with_url_before_the_command_goes_there_not_to_delayq_url(
    make_topology, rabbitmq_url, tmp_path
):
    # A tier long enough that the message is still in it when counted (a 1 s tier
    # could have forwarded it already on a loaded machine).
    topo = make_topology(["1h"])
    apply_topology(topo, rabbitmq_url)
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(topo.model_dump(mode="json")))
    tier = f"{topo.namespace}.tier.1h"
    publish = ["publish", "-k", "job.x", "-d", "1h", "--file", str(path)]

    assert_refused_here(run(rabbitmq_url, "--url", DEAD, *publish))
    assert_refused_here(run(rabbitmq_url, "--url", DEAD, "--file", str(path), *publish[:-2]))
    assert depth(rabbitmq_url, tier) == 0  # nothing reached the $DELAYQ_URL broker
    # The control: without --url the same command does publish to $DELAYQ_URL.
    assert run(rabbitmq_url, *publish).returncode == 0
    # A quorum queue's count can lag its confirm a little: wait for it.
    wait_for(lambda: depth(rabbitmq_url, tier) == 1, 10, f"one message in {tier}")


@pytest.mark.parametrize(
    "argv",
    [
        ["--url", DEAD, "dlq", "purge", "{q}", "--yes"],
        ["dlq", "--url", DEAD, "purge", "{q}", "--yes"],
        ["--url", DEAD, "dlq", "replay", "{q}", "--all"],
        ["--url", DEAD, "dlq", "list", "{q}"],
        ["--url", DEAD, "stats", "--no-management"],
    ],
    ids=["purge-before", "purge-between", "replay-before", "list-before", "stats-before"],
)
def test_dlq_commands_with_url_before_act_on_that_broker_only(
    argv, make_topology, rabbitmq_url, tmp_path: Path
):
    topo = make_topology(["1s"])
    queue = f"{topo.namespace}.work"
    apply_topology(topo, rabbitmq_url)
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(topo.model_dump(mode="json")))
    with Publisher(rabbitmq_url, topo) as pub:  # one parked message on the live broker
        parked = MessageFactory(topo).build({"x": 1}, "job.r", "0s", message_id="keep-me")
        object.__setattr__(parked, "exchange", "")
        object.__setattr__(parked, "routing_key", f"{queue}.dlq")
        pub.send(parked)
    assert depth(rabbitmq_url, f"{queue}.dlq") == 1

    argv = [*(a.replace("{q}", queue) for a in argv), "--file", str(path)]
    assert_refused_here(run(rabbitmq_url, *argv))
    assert depth(rabbitmq_url, f"{queue}.dlq") == 1  # not purged, not replayed
