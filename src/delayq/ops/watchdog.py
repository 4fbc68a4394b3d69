"""The watchdog of ``delayq topology heal`` and ``delayq worker --heal``.

Every ``interval`` it reads the topology's tier, retry tier and level queues from
the management API, feeds them to a :class:`~delayq.ops.heal.StallDetector`,
and for each queue whose dead letters stopped moving logs a warning, tells its
observers (Prometheus metrics), and, when given a remedy, gives the queue a new
leader: a new leader starts a new dead-letter worker, which is what releases the
stuck messages on RabbitMQ 3.10.8 (docs/operations/deployment.md).

>>> dog = Watchdog(topology, [ManagementAPI("http://guest:guest@rabbit1:15672/")],
...                remedy=TransferLeadership())                   # doctest: +SKIP
>>> dog.run(stop)                                                  # doctest: +SKIP

The remedy runs ``rabbitmqctl eval`` on a node of the cluster, so it needs the
CLI tools and the Erlang cookie where the watchdog runs; without a remedy the
watchdog only detects and reports.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from delayq.durations import Duration, to_ms
from delayq.errors import BrokerError, DelayqError, InvalidInput, ManagementUnavailable
from delayq.ops.heal import (
    DEFAULT_INTERVAL,
    DEFAULT_THRESHOLD,
    QueueSample,
    Stall,
    StallDetector,
    forwarding_queues,
    sample_from_api,
)
from delayq.ops.management import ManagementAPI
from delayq.ops.rabbitmqctl import erlang_binary, erlang_node, run_ctl
from delayq.topology.model import Topology

__all__ = [
    "HealEvent",
    "HealObserver",
    "HealOutcome",
    "Remedy",
    "TransferLeadership",
    "Watchdog",
]

log = logging.getLogger("delayq.watchdog")

_COLUMNS = (
    "name",
    "type",
    "leader",
    "members",
    "online",
    "messages",
    "messages_ready",
    "messages_unacknowledged",
)


class Remedy(Protocol):
    """What gives a queue a new leader."""

    def move_leader(self, vhost: str, queue: str, leader: str | None, target: str) -> None:
        """Make ``target`` (an online member) lead ``queue``; raise a DelayqError if refused."""


@dataclass(frozen=True)
class TransferLeadership:
    """Moves a quorum queue's leader with ``rabbitmqctl eval`` on the target node, calling
    ``rabbit_quorum_queue:transfer_leadership/2`` (RabbitMQ 3.8 and later; what
    ``rabbitmq-queues rebalance`` does for one queue). Unlike removing the leader's
    member and adding it back, it keeps working while another member is down.

    ``command`` is the ``rabbitmqctl`` to run (a path, or ``kubectl exec pod --
    rabbitmqctl``); ``-n <target>`` is added unless it names a node already.
    ``erlang_cookie`` is passed as ``--erlang-cookie`` (else the CLI reads
    ``$HOME/.erlang.cookie``); ``env`` replaces the command's environment.
    """

    command: tuple[str, ...] = ("rabbitmqctl",)
    erlang_cookie: str | None = None
    timeout: Duration = "60s"
    env: Mapping[str, str] | None = None

    def expression(self, vhost: str, queue: str, target: str) -> str:
        """The Erlang expression evaluated: names go in as bytes, so nothing in them is code."""
        resource = f"rabbit_misc:r({erlang_binary(vhost)}, queue, {erlang_binary(queue)})"
        return (
            f"case rabbit_amqqueue:lookup({resource}) of "
            f"{{ok, Q}} -> rabbit_quorum_queue:transfer_leadership(Q, {erlang_node(target)}); "
            "Other -> Other end."
        )

    def move_leader(self, vhost: str, queue: str, leader: str | None, target: str) -> None:
        args: list[str] = []
        if not any(part in ("-n", "--node") for part in self.command):
            args += ["-n", target]
        if self.erlang_cookie:
            args += ["--erlang-cookie", self.erlang_cookie]
        args += ["eval", self.expression(vhost, queue, target)]
        output = run_ctl(
            self.command,
            args,
            what=f"moving the leader of {queue} to {target}",
            timeout_s=to_ms(self.timeout, what="timeout") / 1000,
            env=self.env,
            hint="pass the rabbitmqctl command with its path (--rabbitmqctl)",
        ).strip()
        # {migrated, Node} up to 4.2; RabbitMQ 4.3 answers {ok, Node} (its new leader)
        if output.startswith(("{migrated,", "{ok,")) or output == "{not_migrated,already_leader}":
            return
        raise BrokerError(f"moving the leader of {queue} to {target} was refused: {output}")


class HealOutcome(Enum):
    DETECTED = "detected"
    """Reported only: no remedy configured."""
    HEALED = "healed"
    """The remedy gave the queue a new leader."""
    FAILED = "failed"
    """The remedy failed (or no other member was online); tried again after ``threshold``."""


@dataclass(frozen=True)
class HealEvent:
    """One stall found, and what the watchdog did about it."""

    stall: Stall
    outcome: HealOutcome
    target: str | None = None
    detail: str = ""

    def describe(self) -> str:
        text = self.stall.describe()
        if self.outcome is HealOutcome.HEALED:
            return f"{text}: leader moved to {self.target}"
        if self.outcome is HealOutcome.FAILED:
            return f"{text}: could not move its leader ({self.detail})"
        return f"{text}: no remedy configured (see `delayq topology heal --move-leaders`)"


class HealObserver(Protocol):
    """Told each stall found (``heal_event``); one that also has a
    ``heal_samples(samples)`` method is given every look's queue samples (the depth
    gauge of :class:`~delayq.observe.metrics.PrometheusObserver`)."""

    def heal_event(self, event: HealEvent) -> None: ...


class Watchdog:
    """Looks at a topology's dead-lettering queues and heals the stalled ones.

    It looks in ``topology.vhost``: ``/`` for a topology that names none (it has no AMQP
    URL whose vhost it could follow; ``delayq topology heal`` gives it the URL's)."""

    def __init__(
        self,
        topology: Topology,
        management: ManagementAPI | Sequence[ManagementAPI],
        *,
        threshold: Duration = DEFAULT_THRESHOLD,
        interval: Duration = DEFAULT_INTERVAL,
        remedy: Remedy | None = None,
        observers: Iterable[HealObserver] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        apis = [management] if isinstance(management, ManagementAPI) else list(management)
        if not apis:
            raise InvalidInput("the watchdog needs at least one management API URL")
        self.topology = topology
        self.apis = apis
        self.detector = StallDetector(threshold)
        self.interval_s = to_ms(interval, what="interval") / 1000
        if self.interval_s <= 0:
            raise InvalidInput(f"interval must be above 0, not {interval!r}")
        self.remedy = remedy
        self.observers = list(observers)
        self._clock = clock
        self.watched = frozenset(forwarding_queues(topology))
        """The queues it looks at: tiers, retry tiers (every shard) and cascade levels."""
        self.events: list[HealEvent] = []
        """Every stall found since the watchdog started, with what was done."""
        self.looks = 0

    def __repr__(self) -> str:
        return f"Watchdog({self.topology.namespace!r}, {[api.url for api in self.apis]!r})"

    def samples(self) -> list[QueueSample]:
        """The watched queues now, from the first management API that answers."""
        failures = []
        for i, api in enumerate(self.apis):
            try:
                rows = api.queues(self.topology.vhost, _COLUMNS)
            except ManagementUnavailable as exc:
                failures.append(str(exc))
                continue
            if i:  # ask the one that answered first next time
                self.apis.insert(0, self.apis.pop(i))
            found = (sample_from_api(row) for row in rows if row.get("name") in self.watched)
            return [sample for sample in found if sample is not None]
        raise ManagementUnavailable("; ".join(failures))

    def look(self) -> list[HealEvent]:
        """One look: the stalls found now, each healed if a remedy is configured."""
        samples = self.samples()
        self.looks += 1
        for observer in self.observers:
            told = getattr(observer, "heal_samples", None)
            if callable(told):
                try:
                    told(samples)
                except Exception:  # an observer must not stop the watchdog
                    log.exception("heal observer %r failed", observer)
        events = [self._handle(stall) for stall in self.detector.observe(samples, self._clock())]
        self.events += events
        return events

    def _handle(self, stall: Stall) -> HealEvent:
        if self.remedy is None:
            event = HealEvent(stall, HealOutcome.DETECTED)
            log.warning("%s", event.describe())
        else:
            event = self._heal(stall, self.remedy)
        for observer in self.observers:
            try:
                observer.heal_event(event)
            except Exception:  # an observer must not stop the watchdog
                log.exception("heal observer %r failed", observer)
        return event

    def _heal(self, stall: Stall, remedy: Remedy) -> HealEvent:
        self.detector.forget(stall.queue)  # healed or not, judge it afresh
        targets = stall.sample.targets
        if not targets:
            event = HealEvent(stall, HealOutcome.FAILED, detail="no other member is online")
            log.error("%s", event.describe())
            return event
        target = targets[self.looks % len(targets)]
        try:
            remedy.move_leader(self.topology.vhost, stall.queue, stall.sample.leader, target)
        except DelayqError as exc:
            event = HealEvent(stall, HealOutcome.FAILED, target, str(exc))
            log.error("%s", event.describe())
            return event
        event = HealEvent(stall, HealOutcome.HEALED, target)
        log.warning("%s", event.describe())
        return event

    def run(self, stop: threading.Event) -> None:
        """Look every ``interval`` until ``stop`` is set. A management API that does not
        answer is logged (once until it answers again) and asked again next time."""
        log.info(
            "watchdog on %s: dead letters stalled for %.0f s are %s",
            self.topology.namespace,
            self.detector.threshold_s,
            "healed by moving the queue's leader" if self.remedy else "reported",
        )
        unreachable = False
        while not stop.is_set():
            try:
                self.look()
                if unreachable:
                    log.info("watchdog: the management API answers again")
                unreachable = False
            except DelayqError as exc:
                if not unreachable:
                    log.warning("watchdog: %s; trying again every %.0f s", exc, self.interval_s)
                unreachable = True
            except Exception:  # never end silently: say why, keep watching
                log.exception("watchdog: look failed")
            stop.wait(self.interval_s)
