"""``delayq spark schedule --retry-for/--backoff/--resume``: misuse refused in one line, and a
job that ends with unconfirmed rows prints its summary, then one error line, exit 1.

The outage itself (a node stopped mid-job) is test_outage.py's, through the library.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

import delayq.spark
from delayq import RowsUnconfirmed
from delayq.cli import main
from delayq.spark import ScheduleSummary
from delayq.sync import apply_topology


@pytest.fixture
def command(rabbitmq_url: str, make_topology: Any, tmp_path: Path) -> list[str]:
    topology = make_topology()
    apply_topology(topology, rabbitmq_url)
    topo_file = tmp_path / "topology.yaml"
    topo_file.write_text(yaml.safe_dump(topology.model_dump(mode="json")))
    source = tmp_path / "rows.jsonl"
    rows = [{"key": f"k{n}", "routing_key": "job.a", "delay": "1s", "body": n} for n in range(20)]
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return [
        "spark", "schedule", str(source), "--file", str(topo_file), "--url", rabbitmq_url,
        "--delay-col", "delay",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--retry-for", "60"], "retry_for"),  # a bare number has no unit
        (["--backoff", "0s"], "backoff must be at least 1ms"),
        (["--retry-for", "soon"], "retry_for"),
    ],
)
def test_bad_retry_settings_are_refused_before_spark_starts(
    command: list[str], extra: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*command, *extra]) == 2
    _, err = capsys.readouterr()
    [line] = err.strip().splitlines()
    assert line.startswith("delayq: error: ") and said in line


def test_resume_from_its_own_errors_dir_or_from_nothing_is_refused(
    spark: Any, command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    errors = str(tmp_path / "errors")
    assert main([*command, "--errors", errors, "--resume", errors]) == 2
    err = capsys.readouterr().err
    assert "delayq: error: resume_from and errors_path are both" in err
    assert "Traceback" not in err
    assert main([*command, "--resume", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert f"delayq: error: cannot resume from {tmp_path / 'nowhere'}: no such directory" in err
    assert "Traceback" not in err


def test_a_job_ending_unconfirmed_prints_its_summary_then_one_error_line(
    spark: Any,
    command: list[str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    summary = ScheduleSummary(
        published={"1s": 15},
        rejected={},
        errors={},
        errors_path=str(tmp_path / "errors"),
        unconfirmed={"1s": 5},
        retried=3,
    )
    seen: dict[str, Any] = {}

    def failing(df: Any, **kwargs: Any) -> ScheduleSummary:
        seen.update(kwargs)
        raise RowsUnconfirmed("5 of 20 rows were not confirmed by the broker (...)", summary)

    monkeypatch.setattr(delayq.spark, "schedule", failing)
    code = main([*command, "--errors", str(tmp_path / "errors"), "--retry-for", "2m",
                 "--backoff", "1s"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 1
    assert (seen["retry_for"], seen["backoff"], seen["resume_from"]) == ("2m", "1s", None)
    assert "1s          15" in out
    assert "unconfirmed: 5 (NOT published;" in out and "--resume" in out
    assert "retried: 3 published rows sent again" in out
    errors = [line for line in err.splitlines() if line.startswith("delayq: error:")]
    assert errors == ["delayq: error: 5 of 20 rows were not confirmed by the broker (...)"]

    assert main([*command, "--json"]) == 1
    out, _ = capsys.readouterr()
    printed = json.loads(out)
    assert printed["unconfirmed"] == {"1s": 5} and printed["retried"] == 3
    assert printed["published"] == {"1s": 15}
