"""The digest a resumed Spark task compares with a killed run's markers
(:mod:`delayq.spark._done_parts`): the same rows in any order match, any other rows not."""

from __future__ import annotations

import random
from typing import Any

from delayq.spark._done_parts import PartDigest, rows_of


def _digest(rows: list[Any]) -> str:
    digest = PartDigest()
    for _ in digest.reading(rows):
        pass
    return digest.value


ROWS = [(f"k{n}", "job.a", "1h", None, None, f'{{"n": {n}}}', None) for n in range(200)]


def test_the_same_rows_in_another_order_have_the_same_digest() -> None:
    shuffled = ROWS[:]
    random.Random(7).shuffle(shuffled)
    assert _digest(shuffled) == _digest(ROWS)
    assert rows_of(_digest(ROWS)) == 200


def test_other_rows_have_another_digest() -> None:
    one_changed = [*ROWS[:-1], ("k199", "job.a", "2h", None, None, '{"n": 199}', None)]
    one_less = ROWS[:-1]
    one_twice = [*ROWS, ROWS[0]]  # a sum, not an xor: a pair does not cancel out
    pair_twice = [*ROWS, ROWS[0], ROWS[0]]
    digests = {_digest(rows) for rows in (ROWS, one_changed, one_less, one_twice, pair_twice)}
    assert len(digests) == 5
    assert _digest([]) == "0-" + "0" * 32


def test_a_killed_run_without_markers_is_resent_whole_and_with_them_skipped_by_digest() -> None:
    from delayq.spark._run_record import RunRecord, resume_plan

    record = RunRecord.start({"plan": "p"}, dry_run=False, resumed_from=None, errors_format="json")
    plan = resume_plan(record, {"plan": "p"}, "errors")
    assert not plan.only_unconfirmed and plan.skip == frozenset()
    assert "no partition of it was confirmed whole, so every row was sent again" in plan.said
    done = frozenset({_digest(ROWS[:100]), _digest(ROWS[100:])})
    plan = resume_plan(record, {"plan": "p"}, "errors", done)
    assert not plan.only_unconfirmed and plan.skip == done
    assert "the 2 partition(s) it got confirmed whole (200 rows) were skipped" in plan.said
