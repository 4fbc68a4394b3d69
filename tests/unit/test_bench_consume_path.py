"""bench/consume_path.py runs as documented (no broker: it hands prepared frames to the
frame feed's reader), and refuses a run it could not measure. The figures are not
looked at: they are measured by the script, never asserted by a test."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "bench/consume_path.py", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.parametrize("kind", [[], ["--dead-lettered"]])
def test_it_prints_pamqps_reading_the_feed_and_the_consumer_per_delivery(kind: list[str]) -> None:
    result = _run("--count", "400", "--rounds", "2", *kind)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    out = result.stdout
    for mode in (
        "raw: pamqp decodes the frames",
        "the feed alone",
        "AsyncConsumer + InMemoryStore",
    ):
        assert mode in out
    assert ("dead-lettered deliveries" if kind else "fresh deliveries") in out
    assert "delayq's flow a delivery:" in out and "over pamqp's reading alone:" in out
    assert "[round 2/2]" in result.stderr


@pytest.mark.parametrize("args", [["--count", "0"], ["--rounds", "-1"], ["--prefetch", "x"]])
def test_it_refuses_counts_it_cannot_measure(args: list[str]) -> None:
    result = _run(*args)
    assert result.returncode == 2
    assert "must be" in result.stderr or "invalid" in result.stderr
