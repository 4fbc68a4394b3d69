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
