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

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, model_validator

from delayq.cascade import Kind, plan_cascade
from delayq.durations import format_ms, to_ms
from delayq.errors import DelayTooLong
from delayq.ladder import Ladder

__all__ = [
    "ROCKETMQ_SCHEDULE",
    "ExponentialBackoff",
    "FixedBackoff",
    "RetryPolicy",
    "ScheduleBackoff",
    "ScheduleRow",
]


def _duration_ms(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else to_ms(value)


DurationMs = Annotated[
    int,
    BeforeValidator(_duration_ms),
    PlainSerializer(format_ms, return_type=str),
    Field(ge=1),
]
"""A duration given as ``"30s"`` or ``timedelta`` (or int ms from code), kept as int ms."""

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
    cumulative_ms: int
    """Time from the first delivery to this attempt, handler time not counted."""

    @property
    def requested(self) -> timedelta:
        return timedelta(milliseconds=self.requested_ms)

    @property
    def cumulative(self) -> timedelta:
        return timedelta(milliseconds=self.cumulative_ms)


class RetryPolicy(BaseModel):
    """Base of the policies: ``delay_ms(attempt)`` and ``max_attempts``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_attempts: int = Field(default=5, ge=1, le=1000)
    """Deliveries to the handler in all, the first one included."""

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

    def schedule(self, ladder: Ladder) -> list[ScheduleRow]:
        """Every retry of this policy on ``ladder``, jitter left out.

        Raises :class:`~delayq.errors.DelayTooLong` naming the retry whose delay
        no tier can hold.
        """

        def wait(requested: int) -> tuple[int, str]:
            tier = ladder.select_ms(requested)
            return (0, "immediate") if tier is None else (tier.ttl_ms, tier.label)

        return self._schedule(wait)

    def schedule_exact(self, unit_ms: int, levels: int) -> list[ScheduleRow]:
        """Every retry of this policy through the exact strategy's cascade (``tier``
        reads ``exact/<hops>``), jitter left out."""

        def wait(requested: int) -> tuple[int, str]:
            plan = plan_cascade(requested, unit_ms, levels, Kind.ADDRESS, "queue")
            return (0, "immediate") if plan is None else (plan.wait_ms, f"exact/{plan.hops}")

        return self._schedule(wait)

    def _schedule(self, wait: Callable[[int], tuple[int, str]]) -> list[ScheduleRow]:
        rows: list[ScheduleRow] = []
        cumulative = 0
        for retry in range(1, self.max_attempts):
            requested = self.base_delay_ms(retry)
            try:
                tier_ms, label = wait(requested)
            except DelayTooLong as exc:
                raise DelayTooLong(f"retry {retry} (attempt {retry + 1}): {exc}") from exc
            cumulative += tier_ms
            rows.append(
                ScheduleRow(
                    attempt=retry + 1,
                    requested_ms=requested,
                    tier_ms=tier_ms,
                    tier=label,
                    cumulative_ms=cumulative,
                )
            )
        return rows


class ExponentialBackoff(RetryPolicy):
    """``initial * multiplier**(retry-1)``, capped at ``max_delay``, minus up to ``jitter``.

    Jitter only shortens a delay (by up to ``jitter * delay``, uniformly), so the
    cap stays a cap; the ladder then rounds up to a tier, which absorbs jitter
    smaller than the gap between tiers.
    """

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
        # Compare in floats before converting: multiplier**retry can be huge.
        raw = self.initial * self.multiplier ** max(0, retry - 1)
        return self.max_delay if raw >= self.max_delay else int(raw)

    def _jittered(self, delay_ms: int, rng: random.Random | None) -> int:
        if not self.jitter:
            return delay_ms
        source = rng if rng is not None else random
        return max(1, delay_ms - int(delay_ms * self.jitter * source.random()))


class FixedBackoff(RetryPolicy):
    """The same delay before every retry."""

    kind: Literal["fixed"] = "fixed"
    delay: DurationMs = 60_000

    def base_delay_ms(self, retry: int) -> int:
        return self.delay


class ScheduleBackoff(RetryPolicy):
    """An explicit list of delays, one per retry (``max_attempts`` = retries + 1)."""

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
        """``ScheduleBackoff.of(ROCKETMQ_SCHEDULE)``."""
        return cls(delays=tuple(_duration_ms(d) for d in delays))

    def base_delay_ms(self, retry: int) -> int:
        return self.delays[min(retry, len(self.delays)) - 1]
