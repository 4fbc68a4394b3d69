"""What the fault suite measured, and docs/RELIABILITY.md written from it."""

from __future__ import annotations

import datetime
import platform
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RESULTS: list[Result] = []

COLUMNS = (
    ("messages", "messages"),
    ("faults", "faults injected"),
    ("lost", "lost"),
    ("doubles", "double effects"),
    ("recover_s", "time to recover (s)"),
    ("duration_s", "run (s)"),
)


@dataclass
class Result:
    scenario: str
    test: str
    figures: dict[str, Any] = field(default_factory=dict)


def _bad_inputs() -> list[tuple[str, str]]:
    """The bad inputs of the unit suite's table: what was tried, what delayq raised."""
    from tests.unit.test_bad_inputs import CASES

    return [(str(case.id), case.values[1].__name__) for case in CASES]  # type: ignore[union-attr]


_SECTION = re.compile(
    r"<!-- rabbitmq (?P<version>[^ ]+) -->\n(?P<body>.*?)<!-- /rabbitmq -->\n", re.S
)


def _sections(path: Path) -> dict[str, str]:
    """The per-version sections a former run left in the report, by version."""
    try:
        text = path.read_text()
    except OSError:
        return {}
    return {m.group("version"): m.group(0) for m in _SECTION.finditer(text)}


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version))


def write_report(path: Path) -> None:
    """Write this run's figures as the section of the RabbitMQ version it ran on, keeping
    the sections of the other versions a former run wrote."""
    from delayq.local.rabbitmq import rabbit_server

    server = rabbit_server()
    version = server.version or "unknown"
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    section = [
        f"<!-- rabbitmq {version} -->",
        f"## RabbitMQ {version}",
        "",
        f"Run {now} on {platform.machine()} ({platform.python_version()}), RabbitMQ {version} "
        f"(server {server.name!r}: local nodes the tests stop, restart and reconfigure).",
        "",
        "| scenario | " + " | ".join(title for _, title in COLUMNS) + " | notes |",
        "|---|" + "---|" * (len(COLUMNS) + 1),
    ]
    for result in RESULTS:
        cells = [str(result.figures.get(key, "")) for key, _ in COLUMNS]
        notes = str(result.figures.get("notes", ""))
        section.append(f"| {result.scenario} | " + " | ".join(cells) + f" | {notes} |")
    section += [
        "",
        "Tests: " + ", ".join(f"`{r.test}`" for r in RESULTS),
        "",
        "<!-- /rabbitmq -->",
        "",
    ]
    sections = {**_sections(path), version: "\n".join(section)}
    lines = [
        "# Reliability",
        "",
        "Written by the fault-injection suite itself from what it measured, a section per",
        "RabbitMQ version it ran on (a run rewrites its own version's); reproduce with:",
        "",
        "```sh",
        "DELAYQ_RELIABILITY_REPORT=docs/RELIABILITY.md .venv/bin/python -m pytest -m faults -s",
        "DELAYQ_RABBITMQ_SERVER=4.0 DELAYQ_RELIABILITY_REPORT=docs/RELIABILITY.md \\",
        "    .venv/bin/python -m pytest -m faults -s",
        "```",
        "",
        "Every scenario publishes with confirms, consumes with a transactional handler that",
        "writes its effect to SQLite in the same commit as its idempotency key, and ends by",
        "checking: every confirmed message handled, none twice in effect, nothing left in",
        "the tiers, retry tiers, work queue, DLQ or unrouted queue (unless the scenario put it",
        "there on purpose).",
        "",
        *(sections[v] for v in sorted(sections, key=_version_key)),
    ]
    try:
        rows = _bad_inputs()
    except Exception:  # the table's shape changed: say so rather than guess
        rows = []
    if rows:
        lines += [
            "## Bad input",
            "",
            "Each is refused before anything is sent, with the named `delayq` error",
            "(`tests/unit/test_bad_inputs.py`; consumer-side bad input: undecodable bodies,",
            "failing key functions and handlers go to the DLQ with the reason,",
            "`tests/integration/test_bad_input.py` and `test_consumer.py`).",
            "",
            "| input | error |",
            "|---|---|",
            *(f"| {what} | `{error}` |" for what, error in rows),
            "",
        ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))
