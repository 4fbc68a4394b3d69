"""``python -m delayq.local``: a RabbitMQ node for development, without root or Docker.

Starts a throwaway node from the installed ``rabbitmq-server`` (Debian's package;
``apt-get install rabbitmq-server`` once), prints its URL on the first line of
stdout as ``DELAYQ_URL=...`` and serves until Ctrl-C or SIGTERM, then stops the node
and deletes its data::

    python -m delayq.local                  # DELAYQ_URL=amqp://guest:guest@127.0.0.1:5672/
    python -m delayq.local --port 0 --management
    python -m delayq.local --server 4.0     # RabbitMQ 4.0.5 (scripts/setup-rabbitmq-4.sh)
    python -m delayq.local --server 4.3     # RabbitMQ 4.3.x (scripts/setup-rabbitmq-4.sh 4.3)

The URL is what every delayq command and class reads from ``$DELAYQ_URL``.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence

from delayq.local.node import LocalNode, LocalNodeError
from delayq.local.ports import free_port, port_free
from delayq.local.rabbitmq import UnknownServer, server_choice

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m delayq.local",
        description="Run a throwaway RabbitMQ node (no root, no Docker) until Ctrl-C.",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=5672,
        help="AMQP port (default 5672; 0 picks a free one)",
    )
    parser.add_argument(
        "--management", action="store_true", help="also run the management HTTP API"
    )
    parser.add_argument(
        "--server",
        default=None,
        help="which RabbitMQ: 'installed' (the default, Debian 12's 3.10.8), '4.0' "
        "(RabbitMQ 4.0.5 from the Debian 13 tree scripts/setup-rabbitmq-4.sh builds) or "
        "'4.3' (4.3.x from Debian testing: scripts/setup-rabbitmq-4.sh 4.3); "
        "default $DELAYQ_RABBITMQ_SERVER, else installed",
    )
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:
        parser.error(f"--port must be from 0 to 65535, got {args.port}")
    try:
        server_choice(args.server)
    except UnknownServer as exc:
        parser.error(str(exc))
    if args.port and not port_free(args.port):
        print(
            f"delayq: port {args.port} is in use (a broker already running there?): "
            "give another with --port, or --port 0 for a free one",
            file=sys.stderr,
        )
        return 1
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        node = LocalNode(
            port=args.port or free_port(), management=args.management, server=args.server
        )
        print(f"starting a RabbitMQ {node.version} node ...", file=sys.stderr, flush=True)
        node.start()
    except LocalNodeError as exc:
        print(f"delayq: {exc}", file=sys.stderr)
        return 1
    try:
        print(f"DELAYQ_URL={node.url}", flush=True)
        if node.management_url is not None:
            print(f"management: {node.management_url}", flush=True)
        print("serving until Ctrl-C", file=sys.stderr, flush=True)
        while not stop.wait(0.25):  # woken now and then: a Ctrl-C's handler runs meanwhile
            pass
    finally:
        print("stopping the node ...", file=sys.stderr, flush=True)
        node.stop()
        node.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
