"""Retry policies as data: how long to wait before each retry, and when to stop.

Attempts count deliveries to the handler: attempt 1 is the first, so a policy
with ``max_attempts=5`` allows four retries before the dead-letter queue. The
delay asked for goes through the ladder like any delay (the smallest tier at or
above it), so :meth:`RetryPolicy.schedule` shows what a policy really does on a
given ladder, a 1 ms initial delay included:

>>> policy = ExponentialBackoff(initial="1s", multiplier=2, max_delay="1m", max_attempts=4)
>>> [row.tier for row in policy.schedule(Ladder.parse(["5s", "30s", "1m"]))]
['5s', '5s', '5s']
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, cast

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    ValidationInfo,
    model_validator,
)

from delayq.durations import format_ms, to_ms
from delayq.errors import DelayTooLong, InvalidDelay, InvalidInput
from delayq.topology.cascade import Strategy
from delayq.topology.ladder import Ladder
from delayq.topology.route import Router, Wait, tier_wait

if TYPE_CHECKING:
    from delayq.topology.model import Topology

__all__ = [
    "ROCKETMQ_SCHEDULE",
    "ExponentialBackoff",
    "FixedBackoff",
    "Overflow",
    "RetryPolicy",
    "ScheduleBackoff",
    "ScheduleRow",
    "check_policy",
    "default_policy",
    "policy_overflow",
]


def _duration_ms(value: object, info: ValidationInfo) -> int:
    # No int shortcut: a bare 1 read as 1 ms is ActiveMQ's initialRedeliveryDelay=1
    # trap (a policy snapped to the smallest tier). A dumped policy holds strings.
    return to_ms(value, what=info.field_name or "duration")


DurationMs = Annotated[
    int,
    BeforeValidator(_duration_ms),
    PlainSerializer(format_ms, return_type=str),
    Field(ge=1),
]
"""A duration given as ``"30s"`` or ``timedelta`` (never a bare number), kept as int ms."""


def _positive_ms(value: object, what: str) -> int:
    """``value`` in ms, refused with the field named when it is not a duration above 0."""
    ms = to_ms(value, what=what)
    if ms < 1:
        raise InvalidDelay(f"{what} must be at least 1ms, got {value!r}")
    return ms


def _invalid(name: str, exc: ValidationError) -> InvalidInput:
    """pydantic's error as delayq's: every problem on one line, the field named."""
    problems = []
    delays_only = True
    for err in exc.errors(include_url=False):
        cause = (err.get("ctx") or {}).get("error")
        text = str(cause) if isinstance(cause, Exception) else err["msg"]
        delays_only = delays_only and isinstance(cause, InvalidDelay)
        where = "".join(
            f"[{part}]" if isinstance(part, int) else f".{part}" for part in err["loc"]
        ).lstrip(".")
        problems.append(f"{where}: {text}" if where and not text.startswith(where) else text)
    kind = InvalidDelay if delays_only else InvalidInput
    return kind(f"invalid {name}: {'; '.join(problems)}")


ROCKETMQ_SCHEDULE = "10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h".split()
"""RocketMQ 4's 16 retry delays (about 4 h 46 m in all)."""


@dataclass(frozen=True, slots=True)
class ScheduleRow:
    """One retry as it will happen on a ladder."""

    attempt: int
    """The delivery this delay leads to (2 = the first retry)."""
    requested_ms: int
    tier_ms: int
    tier: str
    """The wait's label: a tier's, ``"exact"`` through the cascade, or ``"immediate"``."""
    cumulative_ms: int
    """Time from the first delivery to this attempt, handler time not counted."""
    hops: int = 1
    """Queues the retry waits in: 1 for a tier, ``popcount(units)`` through the cascade."""

    @property
    def requested(self) -> timedelta:
        return timedelta(milliseconds=self.requested_ms)

    @property
    def cumulative(self) -> timedelta:
        return timedelta(milliseconds=self.cumulative_ms)


class RetryPolicy(BaseModel):
    """Base of the policies: ``delay_ms(attempt)`` and ``max_attempts``.

    Constructors raise :class:`~delayq.errors.InvalidInput` (a bare number as a
    duration: :class:`~delayq.errors.InvalidDelay`), never pydantic's own error.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    _durations: ClassVar[tuple[str, ...]] = ()
    """The fields that are durations (checked first, for an error naming the field)."""

    max_attempts: int = Field(default=5, ge=1, le=1000)
    """Deliveries to the handler in all, the first one included."""

    _positional: ClassVar[str | None] = None
    """The one field that may be given positionally (``FixedBackoff("1s")``), if any."""

    def __init__(self, *args: Any, **data: Any) -> None:
        name = type(self).__name__
        if args:
            data = self._positional_data(args, data)
        for field in self._durations:
            value = data.get(field)
            if isinstance(value, (str, bytes)) and field == "delays":
                raise InvalidInput(
                    f"{name} delays takes a list of durations, not the string {value!r}: "
                    'write ["10s", "30s"] (or "10s 30s".split())'
                )
            if isinstance(value, (tuple, list)):
                for index, item in enumerate(value):
                    _positive_ms(item, f"{name} {field}[{index}]")
            elif field in data:
                _positive_ms(value, f"{name} {field}")
        for field, value in data.items():
            # pydantic reads True as 1: max_attempts=True would mean one attempt.
            if isinstance(value, bool):
                raise InvalidInput(f"{name} {field} is a bool ({value!r}), not a number")
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise _invalid(name, exc) from None

    @classmethod
    def _positional_data(cls, args: tuple[Any, ...], data: dict[str, Any]) -> dict[str, Any]:
        """``data`` with the one positional argument under its field name."""
        name, field = cls.__name__, cls._positional
        if field is None:
            raise InvalidInput(
                f"{name} takes keyword arguments: "
                f'{name}(initial="30s", max_delay="1h", max_attempts=5)'
            )
        if len(args) > 1:
            raise InvalidInput(
                f"{name} takes one positional argument, {field}; the rest by keyword "
                f"(max_attempts=...), got {len(args)} positional arguments"
            )
        if field in data:
            raise InvalidInput(f"{name} {field} given twice (positionally and by keyword)")
        return {field: args[0], **data}

    def base_delay_ms(self, retry: int) -> int:
        """The delay before retry number ``retry`` (1-based), before jitter."""
        raise NotImplementedError

    def delay_ms(self, attempt: int, rng: random.Random | None = None) -> int | None:
        """The delay after a failed ``attempt``, or ``None`` when the attempts are spent."""
        if attempt >= self.max_attempts:
            return None
        return self._jittered(self.base_delay_ms(attempt), rng)

    def _jittered(self, delay_ms: int, rng: random.Random | None) -> int:
        return delay_ms

    def schedule(self, route: Ladder | Router, *, retries: int | None = None) -> list[ScheduleRow]:
        """Every retry of this policy (or the first ``retries``), jitter left out, on a
        ladder or as a topology's :class:`~delayq.topology.route.Router` routes retries (its
        strategy: tiered, or the exact cascade).

        Raises :class:`~delayq.errors.DelayTooLong` naming the retry whose delay
        no tier can hold (see :func:`policy_overflow` to find it without raising).
        """
        if isinstance(route, Router):
            return self._schedule(route.wait, retries)
        ladder = route
        return self._schedule(lambda requested: tier_wait(ladder, requested), retries)

    def _schedule(self, wait: Callable[[int], Wait], retries: int | None) -> list[ScheduleRow]:
        rows: list[ScheduleRow] = []
        cumulative = 0
        last = self.max_attempts if retries is None else min(self.max_attempts, retries + 1)
        for retry in range(1, last):
            requested = self.base_delay_ms(retry)
            try:
                waited = wait(requested)
            except DelayTooLong as exc:
                raise DelayTooLong(f"retry {retry} (attempt {retry + 1}): {exc}") from exc
            cumulative += waited.ms
            rows.append(
                ScheduleRow(
                    attempt=retry + 1,
                    requested_ms=requested,
                    tier_ms=waited.ms,
                    tier=waited.shown,
                    cumulative_ms=cumulative,
                    hops=waited.hops,
                )
            )
        return rows


class ExponentialBackoff(RetryPolicy):
    """``initial * multiplier**(retry-1)``, capped at ``max_delay``, minus up to ``jitter``.

    Jitter only shortens a delay (by up to ``jitter * delay``, uniformly), so the
    cap stays a cap; the ladder then rounds up to a tier, which absorbs jitter
    smaller than the gap between tiers.
    """

    _durations = ("initial", "max_delay")

    kind: Literal["exponential"] = "exponential"
    initial: DurationMs = 30_000
    multiplier: float = Field(default=2.0, ge=1.0, le=100.0)
    max_delay: DurationMs = 3_600_000
    jitter: float = Field(default=0.0, ge=0.0, le=1.0)

    @model_validator(mode="after")
    def _cap_above_initial(self) -> ExponentialBackoff:
        if self.max_delay < self.initial:
            raise ValueError(
                f"max_delay {format_ms(self.max_delay)} is shorter than initial "
                f"{format_ms(self.initial)}"
            )
        return self

    def base_delay_ms(self, retry: int) -> int:
        steps = max(0, retry - 1)
        # Compared in log space: multiplier**steps overflows a float (OverflowError) long
        # before the retries run out (100**154 already); past the cap it is not needed.
        if steps * math.log(self.multiplier) >= math.log(self.max_delay / self.initial):
            return self.max_delay
        return min(self.max_delay, int(self.initial * self.multiplier**steps))

    def _jittered(self, delay_ms: int, rng: random.Random | None) -> int:
        if not self.jitter:
            return delay_ms
        source = rng if rng is not None else random
        return max(1, delay_ms - int(delay_ms * self.jitter * source.random()))


class FixedBackoff(RetryPolicy):
    """The same delay before every retry: ``FixedBackoff("1m", max_attempts=3)``."""

    _durations = ("delay",)
    _positional = "delay"

    kind: Literal["fixed"] = "fixed"
    delay: DurationMs = 60_000

    def base_delay_ms(self, retry: int) -> int:
        return self.delay


class ScheduleBackoff(RetryPolicy):
    """An explicit list of delays, one per retry (``max_attempts`` = retries + 1):
    ``ScheduleBackoff(["10s", "1m", "10m"])``."""

    _durations = ("delays",)
    _positional = "delays"

    kind: Literal["schedule"] = "schedule"
    delays: tuple[DurationMs, ...] = Field(min_length=1)
    max_attempts: int = Field(default=0, ge=0, le=1000)

    @model_validator(mode="after")
    def _attempts_follow_the_schedule(self) -> ScheduleBackoff:
        wanted = len(self.delays) + 1
        if self.max_attempts not in (0, wanted):
            raise ValueError(
                f"max_attempts {self.max_attempts} disagrees with {len(self.delays)} delays "
                f"(which make {wanted} attempts); leave it out"
            )
        object.__setattr__(self, "max_attempts", wanted)
        return self

    @classmethod
    def of(cls, delays: Sequence[object]) -> ScheduleBackoff:
        """``ScheduleBackoff.of(ROCKETMQ_SCHEDULE)``, ``ScheduleBackoff.of(["10s", "1m"])``."""
        if isinstance(delays, (str, bytes)):
            raise InvalidInput(
                f"ScheduleBackoff.of takes a list of durations, not the string {delays!r}: "
                'write ["10s", "30s"] (or "10s 30s".split())'
            )
        try:
            items = tuple(delays)
        except TypeError:
            raise InvalidInput(
                f"ScheduleBackoff.of takes a list of durations, not {delays!r}"
            ) from None
        return cls(delays=cast(Any, items))

    def base_delay_ms(self, retry: int) -> int:
        return self.delays[min(retry, len(self.delays)) - 1]


# Policies on a topology -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Overflow:
    """The first retry of a policy that no tier (or cascade) of a topology can hold."""

    retry: int
    """1-based: the delay after a failed attempt ``retry``."""
    requested_ms: int
    limit_ms: int
    """The longest wait the topology offers a retry."""
    limit: str
    """That limit in words: ``"the largest tier 24h"``."""

    def __str__(self) -> str:
        return (
            f"retry {self.retry} (before attempt {self.retry + 1}) asks for "
            f"{format_ms(self.requested_ms)}, longer than {self.limit}: at run time it would "
            "go to the dead-letter queue as delay-too-long"
        )


def policy_overflow(policy: RetryPolicy, topology: Topology) -> Overflow | None:
    """The first retry whose delay (before jitter, which only shortens it) exceeds what
    ``topology`` can hold, or ``None`` when every retry fits."""
    limit_ms, limit = Router(topology).longest()
    for retry in range(1, policy.max_attempts):
        requested = policy.base_delay_ms(retry)
        if requested > limit_ms:
            return Overflow(retry, requested, limit_ms, limit)
    return None


def check_policy(policy: RetryPolicy, topology: Topology, *, queue: str | None = None) -> None:
    """Refuse a policy whose retries the topology cannot hold, saying how to fix it.

    Raises :class:`~delayq.errors.InvalidInput`. A handler's own ``Retry(delay)``
    is only known at run time and still dead-letters as delay-too-long.
    """
    over = policy_overflow(policy, topology)
    if over is None:
        return
    where = f" for queue {queue!r}" if queue else ""
    limit = format_ms(over.limit_ms)
    fix = (
        f'cap it (max_delay="{limit}")'
        if isinstance(policy, ExponentialBackoff)
        else f"keep every delay at or below {limit}"
    )
    grow = (
        "raise exact.levels or exact.unit"
        if topology.strategy is Strategy.EXACT
        else f"add a tier of at least {format_ms(over.requested_ms)} to the ladder"
    )
    raise InvalidInput(f"retry policy{where}: {over}; {fix}, or {grow}")


def default_policy(topology: Topology) -> ExponentialBackoff:
    """The policy of a consumer given none: 30 s doubling to 1 h, 5 attempts, with
    every delay capped at the longest wait ``topology`` offers (so a short test
    ladder retries instead of dead-lettering every failure as delay-too-long)."""
    limit_ms, _ = Router(topology).longest()
    initial, cap = min(30_000, limit_ms), min(3_600_000, limit_ms)
    durations: dict[str, Any] = {
        "initial": timedelta(milliseconds=initial),
        "max_delay": timedelta(milliseconds=cap),
    }
    return ExponentialBackoff(**durations)
