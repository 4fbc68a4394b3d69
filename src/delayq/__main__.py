"""``python -m delayq``: the same as the ``delayq`` command."""

from __future__ import annotations

from delayq.cli import main

raise SystemExit(main())
