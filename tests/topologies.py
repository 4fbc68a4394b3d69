"""Throwaway topologies for tests against a real broker: unique namespaces, deleted after."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from delayq import Topology
from delayq.sync import delete_topology


@contextlib.contextmanager
def throwaway_topologies(
    url: str, *, prefix: str, ladder: Iterable[str]
) -> Iterator[Callable[..., Topology]]:
    """Yield ``make(ladder=..., **topology_options)``: a topology under a fresh namespace
    ``<prefix><10 hex>`` with a ``<ns>.work`` queue bound to ``job.#`` unless
    ``destinations`` are given. Every topology made is deleted from ``url`` at the end."""
    made: list[Topology] = []
    default_ladder = tuple(ladder)

    def make(ladder: Iterable[str] = default_ladder, **kwargs: Any) -> Topology:
        ns = f"{prefix}{uuid.uuid4().hex[:10]}"
        destinations = kwargs.pop("destinations", [{"queue": f"{ns}.work", "bindings": ["job.#"]}])
        topology = Topology(namespace=ns, ladder=list(ladder), destinations=destinations, **kwargs)
        made.append(topology)
        return topology

    try:
        yield make
    finally:
        for topology in made:
            with contextlib.suppress(Exception):
                delete_topology(topology, url)
