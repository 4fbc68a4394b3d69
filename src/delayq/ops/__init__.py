"""Operator commands, their pure halves: ``verify`` (a topology against the broker),
``depths`` (``delayq stats``), ``parked`` and ``parked_view`` (dead letters and unrouted
messages), ``grant`` and ``permissions`` (least-privilege users), ``management`` (the
management API). The pika halves live in :mod:`delayq.sync`."""
