"""docs/operations/grafana-dashboard.json is a dashboard Grafana loads, and its PromQL
names only series delayq exports (derived from delayq.observe.metrics.METRICS)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from delayq.observe.metrics import METRICS
from delayq.schedule.gauges import SCHEDULE_METRICS

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "operations" / "grafana-dashboard.json"

_KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
    "unless", "offset", "inf", "nan",
}  # fmt: skip


def exported_series() -> dict[str, str]:
    """Every series name delayq's metrics expose, to the metric it belongs to."""
    series: dict[str, str] = {}
    for name, (kind, _labels, _help) in {**METRICS, **SCHEDULE_METRICS}.items():
        if kind == "histogram":
            for suffix in ("_bucket", "_sum", "_count"):
                series[name + suffix] = name
        else:
            series[name] = name
    return series


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (not its functions, labels, keywords)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # label values, quoted
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        word = match.group(0)
        if text[match.end() :].lstrip().startswith("("):
            continue  # a function or an aggregation
        if word.lower() in _KEYWORDS or word.startswith("__"):
            continue
        names.add(word)
    return names


def _load() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def _exprs(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    found = [
        (panel["title"], target["expr"])
        for panel in dashboard["panels"]
        for target in panel.get("targets", ())
    ]
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            inner = re.fullmatch(r"label_values\((\w+),\s*\w+\)", query["query"])
            assert inner is not None, query
            found.append((f"${variable['name']}", inner.group(1)))
    return found


def test_the_dashboard_has_grafanas_shape() -> None:
    dashboard = _load()
    assert isinstance(dashboard["title"], str) and dashboard["title"]
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}", dashboard["uid"])
    assert isinstance(dashboard["schemaVersion"], int) and dashboard["schemaVersion"] >= 30
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    panels = dashboard["panels"]
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) for i in ids)
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        grid = panel["gridPos"]
        assert all(isinstance(grid[k], int) and grid[k] >= 0 for k in ("h", "w", "x", "y"))
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        mine = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not cells & mine, f"{panel['title']} overlaps another panel"
        cells |= mine
        if panel["type"] == "row":
            continue
        assert panel["type"] in {"timeseries", "heatmap", "stat", "gauge", "table", "bargauge"}
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        targets = panel["targets"]
        assert targets, panel["title"]
        assert len({t["refId"] for t in targets}) == len(targets)
        for target in targets:
            used = set(re.findall(r"\$\{?(\w+)\}?", target["expr"])) - {"__rate_interval"}
            assert used <= variables, (panel["title"], used - variables)


def test_every_query_names_only_series_delayq_exports() -> None:
    series = exported_series()
    for where, expr in _exprs(_load()):
        names = metric_names(expr)
        assert names, f"{where}: no metric in {expr!r}"
        unknown = names - set(series)
        assert not unknown, f"{where}: {sorted(unknown)} are not exported by delayq ({expr!r})"


def test_every_metric_delayq_exports_has_a_panel() -> None:
    series = exported_series()
    shown = {series[name] for _where, expr in _exprs(_load()) for name in metric_names(expr)}
    assert shown == set(METRICS) | set(SCHEDULE_METRICS)


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('sum by (queue) (rate(delayq_retried_total{queue=~"a|b"}[5m]))', {"delayq_retried_total"}),
        (
            "histogram_quantile(0.95, sum by (le) (rate(delayq_lateness_seconds_bucket[1m])))",
            {"delayq_lateness_seconds_bucket"},
        ),
        ("rabbitmq_queue_messages_ready / on (queue) up", {"rabbitmq_queue_messages_ready", "up"}),
    ],
)
def test_the_name_reader_finds_metrics_and_only_them(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names
    if "rabbitmq" in expr:  # what the dashboard test would refuse
        assert names - set(exported_series())
