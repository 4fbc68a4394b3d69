"""The pure parts of the soak benchmark (``bench/soak_report.py``), without a broker."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayq.errors import InvalidDelay

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load(name: str) -> ModuleType:
    # bench/ is a folder of scripts, not a package: load the module from its file.
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module


report = _load("soak_report")

STATUS = """Name:\tpython
Umask:\t0022
State:\tS (sleeping)
VmPeak:\t  812340 kB
VmSize:\t  747804 kB
VmHWM:\t   42116 kB
VmRSS:\t   41236 kB
RssAnon:\t   30000 kB
Threads:\t3
"""


# Percentiles ------------------------------------------------------------------------------


def test_percentile_is_the_nearest_rank():
    values = list(range(1, 101))  # 1..100
    assert report.percentile(values, 50) == 50
    assert report.percentile(values, 99) == 99
    assert report.percentile(values, 100) == 100
    assert report.percentile([1, 2, 3, 4], 50) == 2
    assert report.percentile([7], 99) == 7
    assert report.percentile([1, 2, 3], 0.1) == 1


def test_percentile_refuses_no_values_and_bad_ranks():
    with pytest.raises(ValueError):
        report.percentile([], 50)
    for p in (0, -1, 100.5):
        with pytest.raises(ValueError):
            report.percentile([1, 2], p)


@given(st.lists(st.integers(-(10**6), 10**6), min_size=1, max_size=200), st.floats(0.01, 100))
def test_percentile_is_a_value_with_enough_at_or_below_it(values, p):
    ordered = sorted(values)
    result = report.percentile(ordered, p)
    assert result in ordered
    at_or_below = sum(1 for v in ordered if v <= result)
    assert at_or_below >= p / 100 * len(ordered) - 1e-9
    below = sum(1 for v in ordered if v < result)
    assert below < p / 100 * len(ordered) + 1e-9  # nothing smaller would do


# Lateness ---------------------------------------------------------------------------------


def handled(tier, tier_ms, delay_ms, published, delivered):
    return report.Handled(tier, tier_ms, delay_ms, published, delivered)


def test_lateness_counts_from_the_delay_asked_and_from_the_tier():
    h = handled("5s", 5000, 3200, 1_000_000, 1_005_012)
    assert h.lateness_ms == 1812  # 1.8 s of rounding up to the tier, 12 ms of transit
    assert h.after_ttl_ms == 12


def test_summarize_groups_by_tier_shortest_first_then_all():
    rows = report.summarize(
        [
            handled("10s", 10_000, 10_000, 0, 10_020),
            handled("1s", 1000, 500, 0, 1005),
            handled("1s", 1000, 1000, 0, 1001),
            handled("immediate", 0, 0, 0, 3),
            handled("1s", 1000, 900, 0, 995),  # before the tier's TTL, still after the ask
        ]
    )
    assert [r.tier for r in rows] == ["immediate", "1s", "10s", "all"]
    one = rows[1]
    assert one.count == 3
    assert (one.late_p50, one.late_p99, one.late_max) == (95, 505, 505)
    assert (one.after_ttl_p50, one.after_ttl_max) == (1, 5)
    assert (one.early, one.before_ttl) == (0, 1)
    everything = rows[-1]
    assert everything.count == 5 and everything.late_max == 505 and everything.after_ttl_max == 20


def test_a_delivery_before_its_due_is_counted_early():
    rows = report.summarize(
        [handled("2s", 2000, 1500, 0, 1499), handled("2s", 2000, 1500, 0, 2001)]
    )
    assert rows[0].early == 1 and rows[-1].early == 1
    assert rows[0].late_p50 == -1


def test_summarize_of_nothing_is_empty():
    assert report.summarize([]) == []


def test_lateness_table_has_a_row_per_tier_and_the_figures():
    rows = report.summarize(
        [handled("1s", 1000, 400, 0, 1010), handled("2s", 2000, 2000, 0, 2_000 + 1234)]
    )
    table = report.lateness_table(rows)
    lines = table.splitlines()
    assert lines[0].split()[:2] == ["tier", "count"]
    body = [line for line in lines if line and not line.startswith("-")][1:]
    assert [line.split()[0] for line in body] == ["1s", "2s", "all"]
    assert body[1].split() == [
        "2s",
        "1",
        "1,234",
        "1,234",
        "1,234",
        "1,234",
        "1,234",
        "1,234",
        "0",
        "0",
    ]
    assert body[0].split()[2] == "610"


# Accounting -------------------------------------------------------------------------------


def test_account_counts_lost_duplicates_and_unconfirmed_deliveries():
    confirmed = [1, 1, 1, 1, 0, 0]
    seen = [1, 0, 3, 1, 1, 0]
    a = report.account(6, confirmed, seen)
    assert (a.sent, a.confirmed, a.not_confirmed) == (6, 4, 2)
    assert a.handled == 3
    assert a.lost == 1  # message 1: confirmed, never handled
    assert a.duplicates == 2  # message 2 ran three times
    assert a.unconfirmed_handled == 1  # message 4
    table = report.accounting_table(a)
    assert "lost (confirmed - handled)" in table
    lost_line = next(line for line in table.splitlines() if line.startswith("lost"))
    assert lost_line.split()[4] == "1"


def test_account_wants_one_entry_per_message():
    with pytest.raises(ValueError):
        report.account(3, [1, 1], [1, 1, 1])


def test_counts_line_shows_a_field_that_is_not_a_count_as_it_is():
    # ConsumerStats holds None until it knows (a park run crashed on it formatting None)
    line = report.counts_line({"handled": 1200, "last_lost": None, "stalled": True})
    assert line == "handled 1,200, last lost -, stalled True"


def test_counts_line():
    assert report.counts_line({"handled": 12000, "dead_lettered": 0}) == (
        "handled 12,000, dead lettered 0"
    )


# RSS --------------------------------------------------------------------------------------


def test_vmrss_is_read_from_proc_status_in_kib():
    assert report.parse_vmrss_kib(STATUS) == 41236


def test_vmrss_missing_or_odd_is_an_error():
    with pytest.raises(ValueError, match="no VmRSS"):
        report.parse_vmrss_kib("Name:\tzombie\nState:\tZ (zombie)\n")
    with pytest.raises(ValueError, match="unexpected"):
        report.parse_vmrss_kib("VmRSS:\t  12 MB\n")


def test_vmrss_of_this_process():
    status = Path("/proc/self/status")  # the soak reads a child's the same way (Linux)
    assert report.parse_vmrss_kib(status.read_text()) > 1024


def test_rss_growth_first_to_last_and_after_warmup():
    samples = [
        report.RssSample(0, 40_000),
        report.RssSample(60, 41_200),
        report.RssSample(120, 41_100),
        report.RssSample(180, 41_024),
    ]
    g = report.rss_growth(samples)
    assert (g.first_kib, g.last_kib, g.max_kib) == (40_000, 41_024, 41_200)
    assert g.growth_kib == 1024
    assert g.growth_after_warmup_kib == -176
    table = report.rss_table(samples)
    assert [line.split()[0] for line in table.splitlines()[1:5]] == ["0s", "1m", "2m", "3m"]
    assert "+1.0 MiB (+2.6%)" in table and "max 40.2 MiB" in table
    assert "to the last: -0.2 MiB" in table


def test_rss_growth_of_two_samples_has_no_warmup_figure():
    g = report.rss_growth([report.RssSample(0, 100), report.RssSample(5, 90)])
    assert g.growth_kib == -10 and g.growth_after_warmup_kib is None
    with pytest.raises(ValueError):
        report.rss_growth([])


# Ladders and broker memory -----------------------------------------------------------------


def test_parse_ladder_sorts_and_dedupes():
    assert report.parse_ladder("5s,1s, 2s 10s,1s") == [1000, 2000, 5000, 10_000]
    assert report.parse_ladder("1h,3h") == [3_600_000, 10_800_000]


def test_parse_ladder_refuses_nonsense():
    with pytest.raises(ValueError):
        report.parse_ladder(" , ")
    with pytest.raises(ValueError):
        report.parse_ladder("0s,1s")
    with pytest.raises(InvalidDelay):
        report.parse_ladder("1s,5")  # a bare number has no unit


def test_broker_memory_line_from_rabbitmqctl_status():
    memory = {
        "binary": 34_603_008,
        "quorum_ets": 12_582_912,
        "quorum_queue_procs": 4 * 2**20,
        "total": {"erlang": 115 * 2**20, "rss": 171 * 2**20, "allocated": 1},
        "strategy": "rss",
    }
    line = report.broker_memory_line(memory)
    assert line.startswith("rss 171 MiB, erlang 115 MiB")
    assert "quorum_queue_procs 4.0 MiB" in line and "binary 33.0 MiB" in line
    assert "msg_index" not in line  # absent figures are left out, not shown as 0
    assert report.broker_memory_line({}) == "no figures"


def test_broker_memory_brief_names_the_two_largest_categories():
    memory = {
        "binary": 158 * 2**20,
        "quorum_ets": 609 * 2**20,
        "other_proc": 19 * 2**20,
        "code": 900 * 2**20,  # not one of the categories a backlog shows up in
        "total": {"rss": 912 * 2**20},
    }
    assert report.broker_memory_brief(memory) == "rss 912 MiB (quorum_ets 609, binary 158)"
    assert report.broker_memory_brief({"total": {"rss": 2**20}}) == "rss 1 MiB"


def test_rss_table_shows_the_broker_column_when_known():
    samples = [report.RssSample(0, 2048, "rss 150 MiB"), report.RssSample(60, 2048, "rss 900 MiB")]
    lines = report.rss_table(samples).splitlines()
    assert lines[0].split() == ["at", "consumer", "RSS", "broker", "memory"]
    assert lines[2].split() == ["1m", "2.0", "MiB", "rss", "900", "MiB"]
