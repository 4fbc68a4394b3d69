"""``delayq migrate plan`` without a broker: what it refuses (clearly, exit 2, nothing
written), what it plans with a warning instead of refusing the whole file, the ladder
it picks and says, and the cut-over steps' wording (issue 48)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from delayq import Topology
from delayq.cli import main
from delayq.durations import format_ms
from delayq.ops.migrate import plan_migration
from delayq.topology.ladder import DEFAULT_LADDER
from tests.guide_blocks import PLUGIN_GUIDE, block


def _exchange(name: str, kind: str = "direct", vhost: str = "/") -> dict[str, Any]:
    return {
        "name": name, "vhost": vhost, "type": "x-delayed-message", "durable": True,
        "auto_delete": False, "internal": False, "arguments": {"x-delayed-type": kind},
    }  # fmt: skip


def _binding(source: str, queue: str, key: str, vhost: str = "/") -> dict[str, Any]:
    return {
        "source": source, "vhost": vhost, "destination": queue,
        "destination_type": "queue", "routing_key": key, "arguments": {},
    }  # fmt: skip


def _orders(vhost: str = "/") -> dict[str, Any]:
    """The guide's broker: ``orders.delayed`` (direct) to ``orders.reminders``."""
    return {
        "exchanges": [_exchange("orders.delayed", vhost=vhost)],
        "bindings": [_binding("orders.delayed", "orders.reminders", "order.reminder", vhost)],
    }


def _plan(tmp_path: Path, definitions: dict[str, Any], *extra: str) -> int:
    path = tmp_path / "definitions.json"
    path.write_text(json.dumps(definitions))
    return main(["migrate", "plan", str(path), "--out", str(tmp_path / "out"), *extra])


def _written(tmp_path: Path) -> list[str]:
    out = tmp_path / "out"
    return sorted(p.name for p in out.iterdir()) if out.is_dir() else []


def test_an_intake_name_that_is_the_plugin_exchanges_own_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It was planned: "point the publishers at 'orders.delayed' instead of
    'orders.delayed'", then "delete exchange 'orders.delayed'"."""
    assert _plan(tmp_path, _orders(), "--intake-name", "{exchange}") == 2
    err = capsys.readouterr().err
    assert "gives exchange 'orders.delayed' its own name" in err
    assert "Why a new exchange name" in err and "Traceback" not in err
    assert _written(tmp_path) == []


def test_an_intake_name_that_is_another_exchange_of_the_vhost_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    definitions = _orders()
    definitions["exchanges"].append({**_exchange("orders.delayed.intake"), "type": "topic"})
    assert _plan(tmp_path, definitions) == 2
    err = capsys.readouterr().err
    assert "the intake 'orders.delayed.intake', an exchange the vhost already has" in err


@pytest.mark.parametrize(
    ("template", "said"),
    [
        ("{exchange}.{vhost}", "{vhost} is not a placeholder"),
        ("{exchange}.{0}", "{0} is not a placeholder"),
        ("{exchange}.{}", "{} is not a placeholder"),
        ("{", "Single '{'"),
        ("{exchange}}", "Single '}'"),
        ("{exchange!x}", "{exchange!x} is not a placeholder"),
        ("{exchange!r}", "{exchange!r} is not a placeholder"),
        ("{exchange:>999999999}", "{exchange:>999999999} is not a placeholder"),
        ("{exchange[0]}", "{exchange[0]} is not a placeholder"),
        ("{exchange.upper}", "{exchange.upper} is not a placeholder"),
        ("intake", "has no {exchange}"),
    ],
)
def test_a_bad_intake_name_template_is_a_usage_error_naming_the_placeholder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], template: str, said: str
) -> None:
    assert _plan(tmp_path, _orders(), "--intake-name", template) == 2
    err = capsys.readouterr().err
    assert said in err and "the only placeholder is {exchange}" in err, err
    assert "Traceback" not in err and err.count("\n") == 1
    assert _written(tmp_path) == []


def test_out_that_is_a_file_or_under_one_is_refused_clearly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    definitions = tmp_path / "definitions.json"
    definitions.write_text(json.dumps(_orders()))
    afile = tmp_path / "afile"
    afile.write_text("mine")
    for out, said in ((afile, "is a file, not a folder"), (afile / "x", "Not a directory"),
                      (Path("/dev/null/x"), "Not a directory")):  # fmt: skip
        assert main(["migrate", "plan", str(definitions), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert f"--out {str(out)!r}" in err and said in err and "Traceback" not in err, err
    assert afile.read_text() == "mine"


def test_a_write_that_fails_leaves_no_half_written_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder the user may not write to (the tests run as root, which may: a refusal
    of the second of two files stands in for it)."""
    definitions = _orders()
    definitions["exchanges"].append(_exchange("billing.delayed"))
    definitions["bindings"].append(_binding("billing.delayed", "invoices", "invoice.due"))
    written: list[Path] = []
    real = Path.write_text

    def write_text(self: Path, text: str, *args: Any, **kwargs: Any) -> int:
        if written:
            raise PermissionError(13, "Permission denied", str(self))
        written.append(self)
        return real(self, text, *args, **kwargs)

    (tmp_path / "definitions.json").write_text(json.dumps(definitions))
    monkeypatch.setattr(Path, "write_text", write_text)
    code = main(["migrate", "plan", str(tmp_path / "definitions.json"),
                 "--out", str(tmp_path / "out")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "cannot write" in err and "Permission denied" in err, err
    assert written and _written(tmp_path) == []  # the first file's copy removed too


def test_an_empty_binding_key_is_left_out_with_a_warning_and_the_rest_planned(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    definitions = _orders()
    definitions["bindings"].append(_binding("orders.delayed", "orders.audit", ""))
    assert _plan(tmp_path, definitions) == 1  # written, but not the broker's every binding
    captured = capsys.readouterr()
    warning = (
        "binding 'orders.delayed' -> 'orders.audit' (routing key '') is left out: delayq "
        "schedules nothing under the empty key, so the intake parks such messages in "
        "delayq.orders.delayed.intake.orders.delayed.intake.dlq"
    )
    assert f"delayq: warning: {warning}" in captured.err
    assert "the plan is not complete" in captured.err
    assert f"before moving publishers: {warning}" in captured.out
    assert _written(tmp_path) == ["delayq.orders.delayed.yaml"]
    from delayq import load_topology

    topology = load_topology(tmp_path / "out" / "delayq.orders.delayed.yaml")
    assert {d.queue: d.bindings for d in topology.destinations} == {
        "orders.reminders": ("order.reminder",)
    }
    assert _plan(tmp_path, definitions, "--json") == 1
    document = json.loads(capsys.readouterr().out)
    assert document["complete"] is False
    assert document["exchanges"][0]["left_out"] == [document["exchanges"][0]["warnings"][0]]


def test_an_exchange_with_no_binding_is_planned_with_a_warning_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    definitions = _orders()
    definitions["exchanges"].append(_exchange("lonely.delayed"))
    assert _plan(tmp_path, definitions) == 0  # nothing of the broker's is left out
    captured = capsys.readouterr()
    warning = (
        "exchange 'lonely.delayed': it has no binding, so its intake has no destination and "
        "every message published to it is parked in "
        "delayq.lonely.delayed.intake.lonely.delayed.intake.dlq"
    )
    assert f"delayq: warning: {warning}" in captured.err
    assert f"before moving publishers: {warning}" in captured.out
    assert "orders.delayed" not in captured.err


def test_without_delays_the_plan_says_the_default_ladder_delivers_small_delays_late(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _plan(tmp_path, _orders()) == 0
    out = capsys.readouterr().out
    smallest = DEFAULT_LADDER.tiers[0].label
    assert (
        f"  ladder: {' '.join(t.label for t in DEFAULT_LADDER.tiers)} (the default: no "
        f"--delays). A message waits for the smallest tier at or above its x-delay: any "
        f"x-delay under {smallest} arrives after {smallest} (x-delay 1500 arrives "
        f"{format_ms(DEFAULT_LADDER.tiers[0].ttl_ms - 1500)} late). For closer tiers pass "
        "--delays FILE (observed x-delay values) or edit the ladder in the file\n"
    ) in out


@pytest.mark.parametrize(
    "sample",
    [{15_000: 5, 60_000: 5}, {1_000: 10, 2_000: 10}, {5_000: 10, 60_000: 10, 900_000: 10}],
)
def test_a_fitted_ladder_keeps_the_default_top_and_nine_tiers(sample: dict[int, int]) -> None:
    """It topped out at the longest delay seen ([15s, 1m]): a longer one later was
    parked, where the default ladder took it."""
    (plan,) = plan_migration(_orders(), delays=sample)
    tiers = [t.ttl_ms for t in plan.topology.ladder.tiers]
    assert tiers[-1] == DEFAULT_LADDER.max_ms and len(tiers) == 9
    assert set(sample) <= set(tiers)  # each a grid value: served on time
    assert "none arrives late" in plan.ladder_note


def test_the_fitted_ladder_and_its_lateness_are_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    delays = tmp_path / "delays.txt"
    delays.write_text("1500\n1500\n45000\n")
    assert _plan(tmp_path, _orders(), "--delays", str(delays)) == 0
    out = capsys.readouterr().out
    (line,) = [line for line in out.splitlines() if line.startswith("  ladder: ")]
    assert line.startswith("  ladder: 2s "), line
    assert " 24h (fitted to 3 observed x-delays, 1s500ms to 45s; the top at least the " in line
    assert line.endswith("arrive up to 15s late: 33.3% of their delay on average, 1.33 times "
                         "it at worst")  # fmt: skip
    written = (tmp_path / "out" / "delayq.orders.delayed.yaml").read_text()
    assert "\nladder: [2s, " in written


@pytest.mark.parametrize(("vhost", "quoted"), [("/", "%2F"), ("a/b c", "a%2Fb%20c")])
def test_the_steps_say_how_to_see_the_drain_and_quote_the_vhost(vhost: str, quoted: str) -> None:
    (plan,) = plan_migration(_orders(vhost), vhost=vhost)
    drain, delete = plan.steps[-2:]
    assert f"messages_delayed (GET /api/exchanges/{quoted}/orders.delayed" in drain
    assert f"DELETE /api/exchanges/{quoted}/orders.delayed)" in delete
    bridge = next(step for step in plan.steps if step.startswith("delayq bridge"))
    assert "supervisor" in bridge and "Restart=always" in bridge


def test_the_plugin_guides_plan_is_what_migrate_plan_prints_and_writes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guide's definitions, planned from a folder of their own as the guide runs it
    (``delayq migrate plan definitions.json``): its output and topology file, as shown."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "definitions.json").write_text(block(PLUGIN_GUIDE, "json", '{\n  "exchanges"'))
    assert main(["migrate", "plan", "definitions.json"]) == 0
    shown = block(PLUGIN_GUIDE, "", "exchange 'orders.delayed' -> ")
    assert capsys.readouterr().out == shown
    written = (tmp_path / "topology" / "delayq.orders.delayed.yaml").read_text()
    assert written == block(PLUGIN_GUIDE, "yaml", "# delayq migrate plan: ")


def test_the_plugin_guides_intake_topology_validates() -> None:
    """Namespace ``orders``, intake ``orders.delayed.intake``: it was refused for starting
    with the namespace (tests/integration/test_plugin_guide.py applies it)."""
    topology = Topology.model_validate(
        yaml.safe_load(block(PLUGIN_GUIDE, "yaml", "# topology/orders.yaml"))
    )
    assert (topology.namespace, topology.intakes[0].exchange) == (
        "orders",
        "orders.delayed.intake",
    )
