#!/bin/sh
# Start RabbitMQ as the image does, then import the delayq topology once the node is up.
set -e
(
  rabbitmqctl await_startup --timeout 120 >/dev/null 2>&1 \
    && rabbitmqctl import_definitions /etc/delayq/definitions.json \
    || echo "delayq: importing /etc/delayq/definitions.json failed" >&2
) &
exec docker-entrypoint.sh rabbitmq-server
