"""Raw AMQP reads the tests make beside delayq's own code (independent of it)."""

from __future__ import annotations

import pika


def depth(url: str, queue: str) -> int:
    """Ready messages in ``queue`` now (a passive declare; quorum counts can lag a
    confirm a little, so wait for a count rather than read it once after a publish)."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        return int(connection.channel().queue_declare(queue, passive=True).method.message_count)
    finally:
        connection.close()


def consumers(url: str, queue: str) -> int:
    """Consumers of ``queue`` now (a passive declare): 0 once a killed consumer's
    connection is closed, and its unacked messages back in the queue."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        return int(connection.channel().queue_declare(queue, passive=True).method.consumer_count)
    finally:
        connection.close()
