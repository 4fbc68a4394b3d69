"""Where a topology file is read from when none is named.

Apart from :mod:`delayq.topology.model` (which re-exports it) so that the command line
can print it in its help without loading pydantic.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["DEFAULT_TOPOLOGY_FILE"]

DEFAULT_TOPOLOGY_FILE = Path("topology/delayq.yaml")
