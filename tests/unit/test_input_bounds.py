"""Inputs past a bound refused clearly (an outside tester's findings): integers longer than
Python's 4,300-digit limit for str <-> int, JSON nested past the recursion limit, a
prefetch past AMQP's 16 bits, a replay rate slower than one message a day, a back-off
that overflows a float, empty values that meant "the default"."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from delayq.cli import main
from delayq.errors import InvalidBody, InvalidDelay, InvalidHeaders, InvalidInput

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGY = str(ROOT / "topology" / "delayq.yaml")
DEAD_URL = "amqp://guest:guest@127.0.0.1:1/"
HUGE = "9" * 5000  # past sys.get_int_max_str_digits() (4300)
DEEP = "[" * 5000 + "]" * 5000  # past the recursion limit


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err, captured.err
    return code, captured.err


# durations ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text", [f"{HUGE}ms", f"1s{HUGE}ms", f"{'0' * 5000}1s9{HUGE}d"], ids=["ms", "s+ms", "0s+d"]
)
def test_a_duration_with_thousands_of_digits_is_an_invalid_delay(text: str) -> None:
    from delayq.durations import to_ms

    with pytest.raises(InvalidDelay, match="longer than any duration") as caught:
        to_ms(text)
    assert len(str(caught.value)) < 400  # the value is shortened, not printed whole


def test_leading_zeros_do_not_make_a_duration_too_long() -> None:
    from delayq.durations import to_ms

    assert to_ms("0" * 5000 + "15m") == 900_000


def test_the_longest_timedelta_in_ms_is_a_duration_and_a_millisecond_more_is_not() -> None:
    from datetime import timedelta

    from delayq.durations import to_ms

    most = timedelta.max // timedelta(milliseconds=1)
    assert to_ms(f"{most}ms") == most
    with pytest.raises(InvalidDelay, match="longer than any duration"):
        to_ms(f"{most + 1}ms")


def test_a_bare_int_of_thousands_of_digits_is_refused_as_a_bare_number() -> None:
    from delayq.durations import to_ms

    with pytest.raises(InvalidDelay, match="bare number") as caught:
        to_ms(10**5000)
    assert len(str(caught.value)) < 600


def test_publish_and_retry_plan_refuse_a_huge_delay_with_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    publish = ("publish", "-f", TOPOLOGY, "--url", DEAD_URL, "-k", "orders.reminder")
    code, err = _run(capsys, *publish, "-d", f"{HUGE}ms")
    assert code == 2 and "longer than any duration" in err, err
    code, err = _run(capsys, "retry-plan", "-f", TOPOLOGY, "--policy", "schedule",
                     "--delays", f"1s {HUGE}s")  # fmt: skip
    assert code == 2 and "longer than any duration" in err, err


# headers -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [10**5000, -(10**5000), 2**63, -(2**63) - 1, [1, 2**64]],
    ids=["huge", "-huge", "2**63", "-2**63-1", "in-a-list"],
)
def test_a_header_int_outside_signed_64_bits_is_invalid_headers(value: Any) -> None:
    from delayq.message.validate import validate_headers

    with pytest.raises(InvalidHeaders, match="signed 64 bits") as caught:
        validate_headers({"h": value})
    assert len(str(caught.value)) < 400


def test_the_64_bit_ends_are_header_ints() -> None:
    from delayq.message.validate import validate_headers

    assert validate_headers({"lo": -(2**63), "hi": 2**63 - 1}) == {"lo": -(2**63), "hi": 2**63 - 1}


# JSON bodies -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "why"), [(f'{{"n": {HUGE}}}', "digits"), (DEEP, "nested")], ids=["long", "deep"]
)
def test_a_json_body_past_pythons_limits_is_invalid_body(text: str, why: str) -> None:
    from delayq.message.envelope import parse_json_body

    with pytest.raises(InvalidBody, match=why):
        parse_json_body(text, "--body")


@pytest.mark.parametrize("text", [f'{{"n": {HUGE}}}', DEEP], ids=["long", "deep"])
def test_publish_refuses_such_a_body_with_exit_2(
    text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _run(capsys, "publish", "-f", TOPOLOGY, "--url", DEAD_URL, "-k",
                     "orders.reminder", "-d", "1s", "--body", text)  # fmt: skip
    assert code == 2 and "--body" in err, err


def test_a_csv_cell_past_pythons_limits_is_invalid_body() -> None:
    from delayq.message.bulk import plain_body

    with pytest.raises(InvalidBody, match="digits"):
        plain_body(f"[{HUGE}]", json_text=True)


def test_a_delivered_json_body_nested_past_the_limit_is_undecodable() -> None:
    from delayq.consume.delivery import Delivery, Undecodable, decode_body

    delivery = Delivery("q", DEEP.encode(), "k", "m1", "application/json", {})
    with pytest.raises(Undecodable, match="nested"):
        decode_body(delivery)


# migrate plan ------------------------------------------------------------------------


def _definitions(tmp_path: Path, key: str = "order.reminder") -> Path:
    path = tmp_path / "definitions.json"
    path.write_text(
        json.dumps(
            {
                "exchanges": [{"name": "e", "vhost": "/", "type": "x-delayed-message",
                               "arguments": {"x-delayed-type": "direct"}}],
                "bindings": [{"source": "e", "vhost": "/", "destination": "q",
                              "destination_type": "queue", "routing_key": key,
                              "arguments": {}}],
            }
        )
    )  # fmt: skip
    return path


@pytest.mark.parametrize(
    ("line", "why"),
    [
        (HUGE, "longer than any"),
        ("\u0663\u0660\u0660\u0660", "is not a delay in milliseconds"),  # Arabic-Indic 3000
        ("+-5", "is not a delay in milliseconds"),
        ("1_000", "is not a delay in milliseconds"),
    ],
    ids=["huge", "arabic-indic", "signs", "underscore"],
)
def test_migrate_delays_take_ascii_digits_within_a_tier(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str, why: str
) -> None:
    delays = tmp_path / "delays"
    delays.write_text(f"1000\n{line}\n", encoding="utf-8")
    code, err = _run(capsys, "migrate", "plan", str(_definitions(tmp_path)), "--out",
                     str(tmp_path / "out"), "--delays", str(delays))  # fmt: skip
    assert code == 2 and why in err and "delays:2" in err, err


def test_migrate_definitions_with_a_huge_number_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "definitions.json"
    path.write_text(f'{{"exchanges": [], "n": {HUGE}}}')
    code, err = _run(capsys, "migrate", "plan", str(path), "--out", str(tmp_path / "o"))
    assert code == 2 and "definitions" in err and "4300 digits" in err, err


def test_an_x_delay_string_of_thousands_of_digits_is_read_as_too_long() -> None:
    from delayq.intake.delay import read_delay

    assert read_delay({"x-delay": HUGE}) > 2**64
    assert read_delay({"x-delay": "-" + HUGE}) == 0
    assert read_delay({"x-delay": "0" * 5000 + "1500"}) == 1500


# back-off ----------------------------------------------------------------------------


def test_an_exponential_backoff_caps_at_max_delay_however_many_retries() -> None:
    from delayq.consume.retry import ExponentialBackoff

    policy = ExponentialBackoff(initial="1s", multiplier=100, max_attempts=1000, max_delay="3s")
    assert [policy.base_delay_ms(r) for r in (1, 2, 3, 999, 10**6)] == [1000] + [3000] * 4
    slow = ExponentialBackoff(initial="1s", multiplier=1.0001, max_delay="1h")
    assert slow.base_delay_ms(1) == 1000 and slow.base_delay_ms(2) == 1000  # 1000.1, floored
    assert slow.base_delay_ms(10**6) == 3_600_000


def test_retry_plan_with_a_huge_multiplier_power_prints_the_capped_plan(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["retry-plan", "-f", TOPOLOGY, "--initial", "1s", "--multiplier", "100",
                 "--max-attempts", "1000", "--max-delay", "3s"])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "Traceback" not in captured.err


def test_the_connection_pause_stays_capped_after_thousands_of_rounds() -> None:
    from delayq.retrying import MAX_PAUSE_S, pause_s

    assert pause_s(5000, 0.25) == MAX_PAUSE_S


# prefetch ----------------------------------------------------------------------------


def test_a_prefetch_past_16_bits_is_refused_at_once_by_the_api() -> None:
    from delayq import Worker, load_topology
    from delayq.consume.settings import ConsumeSettings

    with pytest.raises(InvalidInput, match="65535"):
        ConsumeSettings.parse(prefetch=70_000, handler_timeout="1m")
    assert ConsumeSettings.parse(prefetch=65_535, handler_timeout="1m").prefetch == 65_535
    topology = load_topology(ROOT / "topology" / "quickstart.yaml")
    worker = Worker(topology)
    with pytest.raises(InvalidInput, match="65535"):
        worker.bridge(prefetch=70_000)

    @worker.handler(topology.destinations[0].queue)
    def handle(body: object) -> None: ...

    with pytest.raises(InvalidInput, match="65535"):
        worker.run(DEAD_URL, prefetch=70_000)


@pytest.mark.parametrize("command", [["bridge"], ["worker", "nowhere:worker"]])
def test_every_prefetch_option_refuses_more_than_16_bits_before_connecting(
    capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    code, err = _run(capsys, *command, "--url", DEAD_URL, "--prefetch", "70000")
    assert code == 2 and "65535" in err, err


# a bridge's stop grace ---------------------------------------------------------------


@pytest.mark.parametrize("grace", ["2h", "-1s", "10", "soon", 10])
def test_a_stop_grace_past_an_hour_or_not_a_duration_is_refused_by_the_api(grace: object) -> None:
    from delayq import Worker, load_topology
    from delayq.sync.bridge import Bridge

    topology = load_topology(ROOT / "topology" / "quickstart.yaml")
    with pytest.raises(InvalidInput, match="stop_grace"):
        Worker(topology).bridge(stop_grace=grace)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="stop_grace"):
        Bridge(DEAD_URL, topology, stop_grace=grace)  # type: ignore[arg-type]


@pytest.mark.parametrize("grace", ["2h", "soon"])
def test_the_stop_grace_option_is_refused_before_connecting(
    capsys: pytest.CaptureFixture[str], grace: str
) -> None:
    code, err = _run(capsys, "bridge", "--url", DEAD_URL, "--stop-grace", grace)
    assert code == 2 and "--stop-grace" in err, err


# replay rate -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "rate",
    [1e-300, 1e-6, 0.0, -5.0, float("nan"), float("inf"), 1e13, 2**2000],
    ids=["1e-300", "1e-6", "0", "-5", "nan", "inf", "1e13", "2**2000"],
)
def test_a_replay_rate_outside_one_a_day_to_1e12_is_refused(rate: float) -> None:
    from delayq.ops.pace import check_rate

    with pytest.raises(InvalidInput, match="rate"):
        check_rate(rate)


def test_one_message_a_day_is_a_rate() -> None:
    from delayq.ops.pace import check_rate

    assert check_rate(1 / 86_400) == 1 / 86_400 and check_rate(5) == 5.0


@pytest.mark.parametrize("rate", ["1e-300", "nan", "0"])
def test_dlq_replay_refuses_such_a_rate_before_connecting(
    capsys: pytest.CaptureFixture[str], rate: str
) -> None:
    code, err = _run(capsys, "dlq", "replay", "q", "--all", "--url", DEAD_URL, "-f", TOPOLOGY,
                     "--rate", rate)  # fmt: skip
    assert code == 2 and "--rate" in err and "rate" in err.split("--rate", 1)[1], err


# empty values that meant "the default" -----------------------------------------------


def test_publish_refuses_an_empty_message_id_before_connecting(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, err = _run(capsys, "publish", "-f", TOPOLOGY, "--url", DEAD_URL, "-k",
                     "orders.reminder", "-d", "1s", "--message-id", "")  # fmt: skip
    assert code == 2 and "message id" in err, err


def test_migrate_plans_warnings_and_steps_name_the_file_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "elsewhere"
    definitions = _definitions(tmp_path, key="")
    argv = ["migrate", "plan", str(definitions), "--out", str(out)]
    code, err = _run(capsys, *argv)
    written = str(out / "delayq.e.yaml")
    assert code == 1 and f"bind 'q' by it in {written}" in err, err
    assert "topology/" not in err
    assert main([*argv, "--json"]) == 1
    document = json.loads(capsys.readouterr().out)["exchanges"][0]
    assert document["topology_file"] == written
    assert all("topology/" not in line for line in document["warnings"] + document["steps"])
    assert any(written in step for step in document["steps"])


def test_an_empty_path_option_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code, err = _run(capsys, "migrate", "plan", str(_definitions(tmp_path)), "--out", "")
    assert code == 2 and "--out" in err and "empty" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["definitions.json"]
    code, err = _run(capsys, "publish", "-f", "", "-k", "orders.reminder", "-d", "1s")
    assert code == 2 and "empty" in err, err


def test_the_plugin_guide_says_the_intake_name_must_contain_exchange(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.guide_blocks import PLUGIN_GUIDE

    text = " ".join(PLUGIN_GUIDE.read_text().split())
    assert "The template must contain `{exchange}`" in text
    code, err = _run(capsys, "migrate", "plan", str(_definitions(tmp_path)), "--out",
                     str(tmp_path / "out"), "--intake-name", "orders.intake")  # fmt: skip
    assert code == 2 and "has no {exchange}" in err, err  # as the guide says
