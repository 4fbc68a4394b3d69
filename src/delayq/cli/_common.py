"""What every ``delayq`` command shares: exit codes, the topology file, the management API."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

from delayq.cli._exits import EXIT_BROKER, EXIT_INPUT, EXIT_INTERRUPTED, EXIT_OK, EXIT_PIPE

# What a command runs is imported when it runs: `delayq --help` builds every command's
# options from this module and must not load pydantic, yaml or ssl for it.
if TYPE_CHECKING:
    from delayq.sync._broker import ManagementChoice
    from delayq.topology.model import Topology

__all__ = [
    "EXIT_BROKER",
    "EXIT_INPUT",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_PIPE",
    "Args",
    "fail",
    "load_cli_topology",
    "management_choice",
    "on_url_vhost",
    "print_json",
    "topology_and_url",
]



class Args(SimpleNamespace):
    """One command's options by name (``args.url``, ``args.json``), as the parser gave them."""


def load_cli_topology(args: Args) -> Topology:
    import yaml

    from delayq.errors import InvalidTopology
    from delayq.topology.model import Topology, load_topology

    topology = load_topology(args.file)
    # load_topology reads an empty file as every default (namespace 'delayq'): on the
    # command line that is a truncated or wrong file far more often than a choice.
    if topology == Topology() and not yaml.safe_load(Path(args.file).read_text("utf-8")):
        raise InvalidTopology(
            f"topology file {str(args.file)!r} is empty; write at least a namespace and "
            "destinations (see topology/delayq.yaml in the delayq repository)"
        )
    return topology


def on_url_vhost(topology: Topology, url: str) -> Topology:
    """``topology`` in the vhost ``url`` connects to: the rule of every command that takes
    a topology file and a URL (see docs/concepts/topology.md, "vhost").

    A topology that names another vhost is refused (:func:`delayq.urls.check_vhost`:
    :class:`~delayq.errors.InvalidInput`, exit 2, apply's message). One that names none
    takes the URL's, set as its ``vhost``: what later reads ``topology.vhost`` (the
    management API's paths, grants, the watchdog) works where the URL points, not in
    ``/`` by default.
    """
    from delayq.urls import check_vhost, memory_broker_name, url_vhost

    check_vhost(topology.declared_vhost, url)
    if topology.declared_vhost is not None or memory_broker_name(url) is not None:
        return topology
    return topology.model_copy(update={"vhost": url_vhost(url)})


def topology_and_url(args: Args) -> tuple[Topology, str]:
    """The topology file (``--file``) and the broker URL (``--url``, else the
    environment's) of a command that uses both, checked by :func:`on_url_vhost` before
    the command does or prints anything."""
    from delayq.urls import resolve_url

    topology = load_cli_topology(args)
    url = resolve_url(args.url)
    return on_url_vhost(topology, url), url


def management_choice(args: Args, url: str) -> ManagementChoice | None:
    from delayq.ops.management import ManagementAPI, management_url_for
    from delayq.sync._broker import ManagementChoice

    if args.no_management:
        return None
    chosen, explicit = management_url_for(url, args.management_url)
    return ManagementChoice(ManagementAPI(chosen), explicit)


def print_json(value: object) -> None:
    """One JSON document on stdout: what ``--json`` prints, for scripts to read."""
    print(json.dumps(value, indent=None, sort_keys=False, default=str))


def fail(message: str, exit_code: int, kind: str, *, as_json: bool) -> int:
    """A failed command's end: ``delayq: error: MESSAGE`` on stderr and, for ``--json``,
    one JSON error object on stdout, so a script reading stdout gets a document either
    way: ``{"error": {"type": KIND, "message": MESSAGE, "exit_code": EXIT_CODE}}``
    (``type`` is the delayq error's class, or ``UsageError`` for a refused command line)."""
    print(f"delayq: error: {message}", file=sys.stderr)
    if as_json:
        print_json({"error": {"type": kind, "message": message, "exit_code": exit_code}})
    return exit_code
