"""``python -m delayq.spark schedule | cancel | report | pack-env | submit-path ...``: the
``delayq spark`` commands, and the file ``spark-submit`` runs::

    spark-submit --master spark://host:7077 ... "$(delayq spark submit-path)" schedule ...

``spark-submit`` runs this file as a script: its own directory would then come first on
``sys.path`` (where ``schedule.py`` and ``cancel.py`` would shadow any module of those
names), so it is taken off before delayq is imported.
"""

from __future__ import annotations

import os
import sys

if not __package__:  # run as a file by spark-submit, not as python -m delayq.spark
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]

from delayq.cli import main


def run(argv: list[str] | None = None) -> int:
    """``delayq spark ARGV``: its exit code."""
    return main(["spark", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    raise SystemExit(run())
