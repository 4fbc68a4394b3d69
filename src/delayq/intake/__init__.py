"""Intakes: plugin-style publishing (an exchange name and an ``x-delay`` header) into
delayq's tiers. :mod:`delayq.intake.delay` reads ``x-delay`` as the plugin did,
:mod:`delayq.intake.relay` decides each message's fate (pure); the bridge that
consumes an intake queue is :class:`delayq.sync.bridge.Bridge` (``delayq bridge``)."""

from delayq.intake.delay import BadDelay, read_delay
from delayq.intake.relay import FANOUT_KEY, Forward, Incoming, Park, Relay

__all__ = ["FANOUT_KEY", "BadDelay", "Forward", "Incoming", "Park", "Relay", "read_delay"]
