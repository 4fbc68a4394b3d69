"""The dead-letter watchdog's pure parts: the stall detector, samples, the queues it
watches, the Erlang quoting of the remedy, and the watchdog with stand-in APIs."""

from __future__ import annotations

import logging
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from delayq import Topology
from delayq.errors import BrokerError, InvalidInput, ManagementUnavailable
from delayq.ops.heal import QueueSample, StallDetector, forwarding_queues, sample_from_api
from delayq.ops.rabbitmqctl import erlang_binary, erlang_node, run_ctl
from delayq.ops.watchdog import HealEvent, HealOutcome, TransferLeadership, Watchdog

NODES = ("rabbit@a", "rabbit@b", "rabbit@c")


def sample(
    queue: str = "ns.tier.5s",
    waiting: int = 10,
    *,
    ready: int = 0,
    leader: str | None = "rabbit@a",
    online: tuple[str, ...] = NODES,
) -> QueueSample:
    return QueueSample(queue, waiting + ready, ready, 0, leader, NODES, online)


# The detector ----------------------------------------------------------------


def test_a_queue_is_stalled_once_its_dead_letters_did_not_move_for_the_threshold() -> None:
    detector = StallDetector("30s")
    assert detector.observe([sample()], 0.0) == []
    assert detector.observe([sample()], 29.9) == []
    [stall] = detector.observe([sample()], 30.0)
    assert stall.queue == "ns.tier.5s" and stall.waiting == 10 and stall.stalled_s == 30.0
    assert "holds 10 dead letters that have not moved for 30 s (leader rabbit@a)" in (
        stall.describe()
    )


def test_a_stall_is_reported_once_until_its_clock_restarts() -> None:
    detector = StallDetector("10s")
    detector.observe([sample()], 0.0)
    assert len(detector.observe([sample()], 10.0)) == 1
    assert detector.observe([sample()], 20.0) == []
    detector.forget("ns.tier.5s")
    assert detector.observe([sample()], 21.0) == []  # the clock starts again here
    assert len(detector.observe([sample()], 31.0)) == 1


def test_dead_letters_that_go_out_restart_the_clock() -> None:
    detector = StallDetector("10s")
    detector.observe([sample(waiting=100)], 0.0)
    detector.observe([sample(waiting=120)], 6.0)  # more came in, none went out: still running
    assert detector.observe([sample(waiting=90)], 9.0) == []  # some went out
    assert detector.observe([sample(waiting=95)], 18.0) == []
    assert len(detector.observe([sample(waiting=95)], 19.0)) == 1


def test_a_count_that_only_grows_for_the_threshold_is_a_stall() -> None:
    detector = StallDetector("10s")
    found = []
    for t, n in enumerate(range(10, 22)):
        found += detector.observe([sample(waiting=n)], float(t))
    assert [(s.waiting, s.stalled_s) for s in found] == [(20, 10.0)]


def test_a_new_leader_restarts_the_clock() -> None:
    detector = StallDetector("10s")
    detector.observe([sample(leader="rabbit@a")], 0.0)
    assert detector.observe([sample(leader="rabbit@b")], 10.0) == []
    assert len(detector.observe([sample(leader="rabbit@b")], 20.0)) == 1


def test_ready_and_unacked_messages_are_not_dead_letters() -> None:
    detector = StallDetector("1s")
    busy = QueueSample("ns.tier.5s", messages=50, ready=40, unacked=10, leader="rabbit@a")
    assert busy.waiting == 0
    detector.observe([busy], 0.0)
    assert detector.observe([busy], 100.0) == []
    assert detector.waiting() == {}


def test_queues_that_empty_or_vanish_are_forgotten() -> None:
    detector = StallDetector("10s")
    detector.observe([sample("q1"), sample("q2")], 0.0)
    assert detector.waiting() == {"q1": 10, "q2": 10}
    detector.observe([sample("q1", waiting=0)], 5.0)  # q1 empty, q2 not listed
    assert detector.waiting() == {}
    assert detector.observe([sample("q1"), sample("q2")], 10.0) == []  # both start afresh


@pytest.mark.parametrize("bad", ["60", 60, "-5s", "0s", "soon"])
def test_a_threshold_without_a_unit_or_above_zero_is_refused(bad: Any) -> None:
    with pytest.raises(InvalidInput, match="threshold"):
        StallDetector(bad)


# Samples and queues ----------------------------------------------------------


def test_samples_come_from_quorum_rows_only_and_missing_counts_are_zero() -> None:
    assert sample_from_api({"name": "q", "type": "classic", "messages": 5}) is None
    fresh = sample_from_api({"name": "q", "type": "quorum", "members": ["a", "b"]})
    assert fresh == QueueSample("q", 0, 0, 0, None, ("a", "b"), ("a", "b"))
    row = {
        "name": "q",
        "type": "quorum",
        "leader": "b",
        "members": ["a", "b", "c"],
        "online": ["b", "c"],
        "messages": 9,
        "messages_ready": 2,
        "messages_unacknowledged": 3,
    }
    got = sample_from_api(row)
    assert got is not None and got.waiting == 4 and got.targets == ("c",)


def test_the_watched_queues_are_tiers_retry_tiers_shards_and_levels_not_destinations() -> None:
    topology = Topology(
        namespace="shop",
        ladder=["1s", "5s"],
        shards=2,
        strategy="exact",
        destinations=[{"queue": "shop.work", "bindings": ["#"]}],
    )
    watched = forwarding_queues(topology)
    assert "shop.tier.1s" in watched and "shop.tier.1s.s1" in watched
    assert any(name.startswith("shop.retry.") for name in watched)
    assert topology.level_name(0) in watched
    assert "shop.work" not in watched and "shop.work.dlq" not in watched
    assert "shop.unrouted" not in watched
    assert len(watched) == len(set(watched))


# The remedy's command --------------------------------------------------------


def test_names_go_into_the_erlang_expression_as_bytes_never_as_code() -> None:
    evil = 'q">>, x), os:cmd("rm -rf /"), <<"'
    assert erlang_binary("ab") == "<<97,98>>"
    assert erlang_binary("é") == "<<195,169>>"
    expression = TransferLeadership().expression("/", evil, "rabbit@b")
    assert "os:cmd" not in expression and '"' not in expression
    assert erlang_node("rabbit@b") == "binary_to_atom(<<114,97,98,98,105,116,64,98>>, utf8)"


def _fake_ctl(tmp_path: Path, output: str, code: int = 0) -> tuple[str, ...]:
    """A stand-in rabbitmqctl: records its arguments, prints ``output``, exits ``code``."""
    script = tmp_path / "ctl.py"
    script.write_text(
        "import json, sys\n"
        f"open({str(tmp_path / 'args.json')!r}, 'w').write(json.dumps(sys.argv[1:]))\n"
        f"print({output!r})\n"
        f"sys.exit({code})\n"
    )
    return (sys.executable, str(script))


def test_the_remedy_runs_eval_on_the_target_node_with_the_cookie(tmp_path: Path) -> None:
    import json

    ctl = _fake_ctl(tmp_path, "{migrated,'rabbit@b'}")
    TransferLeadership(ctl, erlang_cookie="SECRET").move_leader("/", "q", "rabbit@a", "rabbit@b")
    args = json.loads((tmp_path / "args.json").read_text())
    assert args[:5] == ["-n", "rabbit@b", "--erlang-cookie", "SECRET", "eval"]
    assert "transfer_leadership" in args[5]


def test_a_command_that_names_its_node_gets_no_second_one(tmp_path: Path) -> None:
    import json

    ctl = (*_fake_ctl(tmp_path, "{migrated,'rabbit@b'}"), "-n", "rabbit@x")
    TransferLeadership(ctl).move_leader("/", "q", "rabbit@a", "rabbit@b")
    args = json.loads((tmp_path / "args.json").read_text())
    assert args.count("-n") == 1 and args[2] == "eval"


@pytest.mark.parametrize(
    ("output", "code", "match"),
    [
        ("{not_migrated,timeout}", 0, "refused: {not_migrated,timeout}"),
        ("{error,not_found}", 0, "refused: {error,not_found}"),
        ("Error: unable to perform an operation on node", 69, r"failed \(69\)"),
    ],
)
def test_a_refused_or_failed_move_is_a_broker_error(
    tmp_path: Path, output: str, code: int, match: str
) -> None:
    with pytest.raises(BrokerError, match=match):
        TransferLeadership(_fake_ctl(tmp_path, output, code)).move_leader("/", "q", "a", "b")


@pytest.mark.parametrize(
    "output",
    [
        "{not_migrated,already_leader}",
        "{migrated,'rabbit@b'}",
        "{ok,'rabbit@b'}",  # RabbitMQ 4.3's answer
    ],
)
def test_a_move_or_already_leading_counts_as_done(tmp_path: Path, output: str) -> None:
    TransferLeadership(_fake_ctl(tmp_path, output)).move_leader("/", "q", "a", "b")


def test_a_missing_or_slow_command_says_so(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="'no-such-rabbitmqctl' was not found"):
        run_ctl(("no-such-rabbitmqctl",), ["status"], what="status")
    slow = (sys.executable, "-c", "import time; time.sleep(30)")
    with pytest.raises(BrokerError, match=r"did not answer within 0\.5 s"):
        run_ctl(slow, [], what="sleeping", timeout_s=0.5)


# The watchdog ------------------------------------------------------------------


class FakeAPI:
    """Answers ``queues`` with the rows it is given, or fails."""

    def __init__(self, rows: list[dict[str, Any]] | None, url: str = "http://fake/") -> None:
        self.rows = rows
        self.url = url
        self.asked = 0

    def queues(self, vhost: str, columns: tuple[str, ...] = ()) -> list[dict[str, Any]]:
        self.asked += 1
        if self.rows is None:
            raise ManagementUnavailable(f"{self.url} cannot be reached")
        return self.rows


def _row(name: str, waiting: int, leader: str = "rabbit@a", online: tuple[str, ...] = NODES):
    return {
        "name": name,
        "type": "quorum",
        "leader": leader,
        "members": list(NODES),
        "online": list(online),
        "messages": waiting,
        "messages_ready": 0,
        "messages_unacknowledged": 0,
    }


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Moves:
    def __init__(self, fail: Exception | None = None) -> None:
        self.calls: list[tuple[str, str, str | None, str]] = []
        self.fail = fail

    def move_leader(self, vhost: str, queue: str, leader: str | None, target: str) -> None:
        self.calls.append((vhost, queue, leader, target))
        if self.fail is not None:
            raise self.fail


class Seen:
    def __init__(self) -> None:
        self.events: list[HealEvent] = []

    def heal_event(self, event: HealEvent) -> None:
        self.events.append(event)


TOPOLOGY = Topology(
    namespace="shop", ladder=["5s"], destinations=[{"queue": "shop.work", "bindings": ["#"]}]
)


def _dog(apis: list[Any], **kw: Any) -> tuple[Watchdog, Clock]:
    clock = Clock()
    return Watchdog(TOPOLOGY, apis, threshold="10s", interval="1s", clock=clock, **kw), clock


def test_the_watchdog_moves_a_stalled_leader_to_an_online_member() -> None:
    rows = [_row("shop.tier.5s", 7, online=("rabbit@a", "rabbit@c")), _row("shop.work", 99)]
    moves, seen = Moves(), Seen()
    dog, clock = _dog([FakeAPI(rows)], remedy=moves, observers=[seen])
    assert dog.look() == []
    clock.now = 10.0
    [event] = dog.look()
    assert event.outcome is HealOutcome.HEALED and event.target == "rabbit@c"
    assert moves.calls == [("/", "shop.tier.5s", "rabbit@a", "rabbit@c")]
    assert seen.events == [event] and dog.events == [event]
    assert "leader moved to rabbit@c" in event.describe()
    clock.now = 15.0
    assert dog.look() == []  # judged afresh after a heal: not moved again at once


def test_without_a_remedy_a_stall_is_reported_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    dog, clock = _dog([FakeAPI([_row("shop.tier.5s", 7)])])
    dog.look()
    clock.now = 10.0
    with caplog.at_level(logging.WARNING, "delayq.watchdog"):
        [event] = dog.look()
    assert event.outcome is HealOutcome.DETECTED
    assert "no remedy configured" in caplog.text and "shop.tier.5s holds 7" in caplog.text


def test_a_failed_move_or_no_member_to_move_to_is_reported_as_failed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    moves = Moves(BrokerError("refused: {not_migrated,timeout}"))
    dog, clock = _dog([FakeAPI([_row("shop.tier.5s", 7)])], remedy=moves)
    dog.look()
    clock.now = 10.0
    with caplog.at_level(logging.ERROR, "delayq.watchdog"):
        [event] = dog.look()
    assert event.outcome is HealOutcome.FAILED and "not_migrated" in event.detail
    assert "could not move its leader" in caplog.text
    alone = _row("shop.tier.5s", 7, online=("rabbit@a",))
    dog, clock = _dog([FakeAPI([alone])], remedy=Moves())
    dog.look()
    clock.now = 10.0
    [event] = dog.look()
    assert event.outcome is HealOutcome.FAILED and event.detail == "no other member is online"


def test_the_watchdog_asks_the_next_api_when_one_does_not_answer() -> None:
    dead, alive = FakeAPI(None, "http://dead/"), FakeAPI([_row("shop.tier.5s", 1)])
    dog, _ = _dog([dead, alive])
    assert [s.queue for s in dog.samples()] == ["shop.tier.5s"]
    assert dog.apis[0] is alive  # asked first from now on
    dog.samples()
    assert dead.asked == 1
    with pytest.raises(ManagementUnavailable, match="http://dead/"):
        _dog([FakeAPI(None, "http://dead/")])[0].samples()


def test_a_failing_observer_does_not_stop_the_watchdog(caplog: pytest.LogCaptureFixture) -> None:
    class Bad:
        def heal_event(self, event: HealEvent) -> None:
            raise RuntimeError("bug")

    # `delayq heal` (run in-process by the CLI tests) quiets this logger for good
    caplog.set_level(logging.ERROR, logger="delayq.watchdog")
    dog, clock = _dog([FakeAPI([_row("shop.tier.5s", 7)])], observers=[Bad()])
    dog.look()
    clock.now = 10.0
    assert len(dog.look()) == 1
    assert "heal observer" in caplog.text


def test_run_keeps_looking_through_an_unreachable_api_and_logs_it_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    api = FakeAPI(None)
    dog, _ = _dog([api])
    stop = threading.Event()
    thread = threading.Thread(target=dog.run, args=(stop,))
    with caplog.at_level(logging.INFO, "delayq.watchdog"):
        thread.start()
        deadline = 100
        while api.asked < 3 and deadline:
            stop.wait(0.1)
            deadline -= 1
        api.rows = []
        asked = api.asked
        while api.asked < asked + 2 and deadline:
            stop.wait(0.1)
            deadline -= 1
        stop.set()
        thread.join(5)
    assert not thread.is_alive() and deadline
    assert caplog.text.count("cannot be reached") == 1
    assert "answers again" in caplog.text


def test_the_watchdog_refuses_bad_settings() -> None:
    with pytest.raises(InvalidInput, match="at least one management API"):
        Watchdog(TOPOLOGY, [])
    with pytest.raises(InvalidInput, match="interval"):
        Watchdog(TOPOLOGY, [FakeAPI([])], interval="0s")  # type: ignore[list-item]
    with pytest.raises(InvalidInput, match="threshold"):
        Watchdog(TOPOLOGY, [FakeAPI([])], threshold="10")  # type: ignore[list-item]


def test_the_metrics_count_each_stall_by_queue_and_outcome() -> None:
    from prometheus_client import CollectorRegistry

    from delayq.observe.metrics import PrometheusObserver

    metrics = PrometheusObserver(CollectorRegistry())
    dog, clock = _dog([FakeAPI([_row("shop.tier.5s", 7)])], observers=[metrics])
    dog.look()
    clock.now = 10.0
    dog.look()
    value = metrics.registry.get_sample_value(
        "delayq_dead_letter_stalls_total", {"queue": "shop.tier.5s", "outcome": "detected"}
    )
    assert value == 1.0


# The command line: options that would be ignored, or cannot work, are refused ------

TOPOLOGY_FILE = str(Path(__file__).parents[2] / "topology" / "delayq.yaml")


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["worker", "app:worker", "--heal-threshold", "5s"], "--heal-threshold is a watchdog"),
        (["worker", "app:worker", "--heal-move-leaders"], "add --heal"),
        (["worker", "app:worker", "--management-url", "http://h:15672/"], "add --heal"),
        (["worker", "app:worker", "--heal", "--rabbitmqctl", "x"], "only with --heal-move-leaders"),
        (["topology", "heal", "--file", TOPOLOGY_FILE, "--threshold", "60"], "threshold"),
        (["topology", "heal", "--file", TOPOLOGY_FILE, "--interval", "0s"], "interval"),
        (
            [
                *("topology", "heal", "--file", TOPOLOGY_FILE, "--move-leaders"),
                "--erlang-cookie-file",
                "/no/such/cookie",
            ],
            "cannot read --erlang-cookie-file",
        ),
        (
            ["topology", "heal", "--file", TOPOLOGY_FILE, "--move-leaders", "--rabbitmqctl", ""],
            "--rabbitmqctl is empty",
        ),
        (["topology", "heal", "--file", TOPOLOGY_FILE, "--management-url", ","], "names no URL"),
    ],
)
def test_heal_options_that_cannot_work_are_refused_before_anything_runs(
    argv: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from delayq.cli import EXIT_INPUT, main

    assert main(argv) == EXIT_INPUT
    assert words in capsys.readouterr().err


def test_watch_and_json_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    from delayq.cli import EXIT_INPUT, main

    assert main(["topology", "heal", "--file", TOPOLOGY_FILE, "--watch", "--json"]) == EXIT_INPUT
    assert "--watch" in capsys.readouterr().err
