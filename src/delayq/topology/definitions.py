"""RabbitMQ definitions export: the topology as a file a broker loads at boot.

The result is accepted by ``rabbitmqctl import_definitions`` and by the
``load_definitions`` setting (docker-compose mounts ``topology/definitions.json``).
"""

from __future__ import annotations

import json
from typing import Any

from delayq.topology.declarations import BindingDecl, ExchangeDecl, QueueDecl, build_declarations
from delayq.topology.model import Topology

__all__ = ["export_definitions", "render_definitions"]


def export_definitions(topology: Topology) -> dict[str, Any]:
    """The definitions document for a topology (no users, no permissions)."""
    vhost = topology.vhost
    exchanges: list[dict[str, Any]] = []
    queues: list[dict[str, Any]] = []
    bindings: list[dict[str, Any]] = []
    for decl in build_declarations(topology):
        if isinstance(decl, ExchangeDecl):
            exchanges.append(
                {
                    "name": decl.name,
                    "vhost": vhost,
                    "type": decl.type,
                    "durable": decl.durable,
                    "auto_delete": False,
                    "internal": False,
                    "arguments": dict(decl.arguments),
                }
            )
        elif isinstance(decl, QueueDecl):
            queues.append(
                {
                    "name": decl.name,
                    "vhost": vhost,
                    "durable": decl.durable,
                    "auto_delete": False,
                    "arguments": dict(decl.arguments),
                }
            )
        elif isinstance(decl, BindingDecl):
            bindings.append(
                {
                    "source": decl.source,
                    "vhost": vhost,
                    "destination": decl.destination,
                    "destination_type": decl.destination_type,
                    "routing_key": decl.routing_key,
                    "arguments": dict(decl.arguments),
                }
            )
    return {
        "vhosts": [{"name": vhost}],
        "exchanges": exchanges,
        "queues": queues,
        "bindings": bindings,
    }


def render_definitions(topology: Topology) -> str:
    """The definitions document as stable, diff-friendly JSON text."""
    return json.dumps(export_definitions(topology), indent=2, sort_keys=True) + "\n"
