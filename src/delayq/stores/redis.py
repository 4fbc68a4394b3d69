"""An idempotency store in Redis: shared by consumers on many hosts.

Each key is a Redis hash ``<prefix><key>`` with one of two shapes:

* a claim: ``{lease_until: <epoch ms>}`` with a Redis TTL of the lease, so a crashed
  consumer's claim disappears by itself;
* a completed key: ``{done_at: <epoch ms>}`` with no TTL (kept until :meth:`prune`),
  or with a TTL of ``retention_ms`` when one is given (Redis forgets it by itself).

A cancelled or rescheduled key also holds ``generation`` (copies below it are
cancelled) and ``marked_at`` (epoch ms of the mark); such a hash loses its lease TTL
and is kept like a completed key (``retention_ms``, else until :meth:`prune`).

Every operation is one Lua script, so a claim is atomic: a completed key answers
DONE (never claimable again until it is pruned or its retention ends), a live lease
answers BUSY, and an expired lease (past ``lease_until`` by the caller's clock, or
removed by its TTL) is claimed afresh.

>>> store = RedisStore("redis://localhost:6379/0")          # doctest: +SKIP
>>> store.claim("order-42", lease_ms=60_000, now_ms=now)    # doctest: +SKIP
<ClaimStatus.CLAIMED: 'claimed'>
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

try:
    import redis
except ImportError as exc:  # pragma: no cover - exercised in a subprocess
    raise ImportError(
        "delayq.stores.redis needs the redis package: pip install 'delayq[redis]'"
    ) from exc

from delayq.errors import InvalidInput
from delayq.stores.base import (
    CANCELLED_GENERATION,
    Cancel,
    CancelStatus,
    Claim,
    ClaimStatus,
    Complete,
    StoreOp,
    check_cancel,
    closed_error,
)
from delayq.stores.uncancel import UncancelStatus, check_uncancel
from delayq.urls import redact

__all__ = ["RedisStore"]

# Results of the claim script.
_STATUS = {
    0: ClaimStatus.CLAIMED,
    1: ClaimStatus.DONE,
    2: ClaimStatus.BUSY,
    3: ClaimStatus.CANCELLED,
}

# KEYS[1] = key; ARGV = now_ms, lease_until, ttl_ms, generation. Times are passed as
# strings made by Python and stored as given (Lua's number formatting would round large
# integers). A marked key keeps its mark (and its TTL, if any: none of the lease's).
_CLAIM = """
local state = redis.call('HMGET', KEYS[1], 'done_at', 'lease_until', 'generation')
if state[3] and tonumber(state[3]) > tonumber(ARGV[4]) then return 3 end
if state[1] then return 1 end
if state[2] and tonumber(state[2]) > tonumber(ARGV[1]) then return 2 end
if state[3] then
  redis.call('HSET', KEYS[1], 'lease_until', ARGV[2])
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'lease_until', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 0
"""

# KEYS[1] = key; ARGV = done_at, retention_ms (0: keep until pruned).
_COMPLETE = """
local mark = redis.call('HMGET', KEYS[1], 'generation', 'marked_at')
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'done_at', ARGV[1])
if mark[1] then redis.call('HSET', KEYS[1], 'generation', mark[1], 'marked_at', mark[2]) end
if tonumber(ARGV[2]) > 0 then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""

# KEYS[1] = key. A completed key stays; a marked one keeps its mark.
_RELEASE = """
local state = redis.call('HMGET', KEYS[1], 'done_at', 'generation')
if state[1] then return 0 end
if state[2] then
  redis.call('HSET', KEYS[1], 'lease_until', '0')
  return 1
end
return redis.call('DEL', KEYS[1])
"""

# KEYS[1] = key; ARGV = now_ms, generation, retention_ms (0: keep until pruned),
# CANCELLED_GENERATION. Results: the index in _CANCEL_STATUS.
_CANCEL = """
local state = redis.call('HMGET', KEYS[1], 'done_at', 'lease_until', 'generation')
if state[1] then return 4 end
if state[2] and tonumber(state[2]) > tonumber(ARGV[1]) then return 3 end
if state[3] and tonumber(state[3]) >= tonumber(ARGV[4]) then return 2 end
if state[3] and tonumber(state[3]) >= tonumber(ARGV[2]) then return 5 end
local known = state[2] or state[3]
redis.call('HSET', KEYS[1], 'lease_until', '0', 'generation', ARGV[2], 'marked_at', ARGV[1])
if tonumber(ARGV[3]) > 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
else
  redis.call('PERSIST', KEYS[1])
end
if known then return 0 end
return 1
"""
_CANCEL_STATUS = (
    CancelStatus.CANCELLED,
    CancelStatus.UNKNOWN,
    CancelStatus.ALREADY_CANCELLED,
    CancelStatus.IN_PROGRESS,
    CancelStatus.ALREADY_HANDLED,
    CancelStatus.OUTDATED,
)

# KEYS[1] = key; ARGV = now_ms, CANCELLED_GENERATION, look_only (1/0). Results: the index
# in _UNCANCEL_STATUS. Only a cancel's mark goes (see delayq.stores.uncancel).
_UNCANCEL = """
local state = redis.call('HMGET', KEYS[1], 'done_at', 'lease_until', 'generation')
if state[1] then return 4 end
if state[3] and tonumber(state[3]) >= tonumber(ARGV[2]) then
  if ARGV[3] == '1' then return 1 end
  redis.call('DEL', KEYS[1])
  return 0
end
if state[2] and tonumber(state[2]) > tonumber(ARGV[1]) then return 3 end
if state[3] and tonumber(state[3]) > 0 then return 2 end
return 5
"""
_UNCANCEL_STATUS = (
    UncancelStatus.UNCANCELLED,
    UncancelStatus.CANCELLED,
    UncancelStatus.RESCHEDULED,
    UncancelStatus.IN_PROGRESS,
    UncancelStatus.ALREADY_HANDLED,
    UncancelStatus.NOT_CANCELLED,
)

# KEYS[1] = key; ARGV[1] = older_than_ms. Keys of another type are left alone.
_PRUNE = """
if redis.call('TYPE', KEYS[1]).ok ~= 'hash' then return 0 end
local state = redis.call('HMGET', KEYS[1], 'done_at', 'lease_until', 'marked_at')
local cutoff = tonumber(ARGV[1])
if state[3] and tonumber(state[3]) >= cutoff then return 0 end
if state[1] then
  if tonumber(state[1]) < cutoff then return redis.call('DEL', KEYS[1]) end
  return 0
end
if state[2] and tonumber(state[2]) < cutoff then return redis.call('DEL', KEYS[1]) end
return 0
"""

_PRUNE_BATCH = 500


def _glob_escape(text: str) -> str:
    """``text`` as a literal in a Redis MATCH pattern."""
    return "".join("\\" + ch if ch in "*?[]\\" else ch for ch in text)


class RedisStore:
    """An :class:`~delayq.stores.base.IdempotencyStore` in Redis.

    ``url_or_client`` is a ``redis://`` / ``rediss://`` / ``unix://`` URL or a
    ``redis.Redis`` client (its connection pool is shared; :meth:`close` then leaves
    it open). Keys live under ``prefix``. With ``retention_ms``, completed keys get a
    Redis TTL and vanish by themselves, so :meth:`prune` usually finds nothing left
    to delete and returns 0; without it they stay until :meth:`prune` (a ``SCAN`` of
    ``prefix*`` that deletes keys completed before the cut-off and expired claims).
    """

    blocking = True

    def __init__(
        self,
        url_or_client: str | redis.Redis,
        *,
        prefix: str = "delayq:idem:",
        retention_ms: int | None = None,
    ) -> None:
        if retention_ms is not None and (
            isinstance(retention_ms, bool) or not isinstance(retention_ms, int) or retention_ms <= 0
        ):
            raise InvalidInput(
                f"retention_ms is a positive number of milliseconds (an int, e.g. "
                f"7 * 86_400_000 for a week), not {retention_ms!r}"
            )
        if not isinstance(prefix, str):
            raise InvalidInput(f"prefix must be a str, not {prefix!r}")
        self.prefix = prefix
        self._closed = False
        self.retention_ms = retention_ms
        if isinstance(url_or_client, str):
            self._where = redact(url_or_client)
            try:
                self._client = redis.Redis.from_url(url_or_client)
            except ValueError as exc:
                raise ValueError(f"bad Redis URL {self._where}: {exc}") from None
            self._own_client = True
        else:
            kwargs: dict[str, Any] = url_or_client.connection_pool.connection_kwargs
            self._where = (
                f"unix://{kwargs['path']}"
                if "path" in kwargs
                else f"redis://{kwargs.get('host', '?')}:{kwargs.get('port', '?')}"
                f"/{kwargs.get('db', 0)}"
            )
            self._client = url_or_client
            self._own_client = False
        try:
            self._client.ping()
        except redis.RedisError as exc:
            if self._own_client:
                self._client.close()
            raise type(exc)(f"cannot use Redis at {self._where}: {exc}") from exc
        self._claim = self._client.register_script(_CLAIM)
        self._complete = self._client.register_script(_COMPLETE)
        self._release = self._client.register_script(_RELEASE)
        self._prune = self._client.register_script(_PRUNE)
        self._cancel = self._client.register_script(_CANCEL)
        self._uncancel = self._client.register_script(_UNCANCEL)

    def __repr__(self) -> str:
        return f"RedisStore({self._where!r}, prefix={self.prefix!r})"

    def _key(self, key: str) -> str:
        # Every call names its keys through here: the one place to refuse a closed store
        # (redis-py would reconnect by itself and the store would silently live on).
        if self._closed:
            raise closed_error(self)
        return self.prefix + key

    def claim(self, key: str, *, lease_ms: int, now_ms: int, generation: int = 0) -> ClaimStatus:
        result = self._claim(
            keys=[self._key(key)], args=self._claim_args(lease_ms, now_ms, generation)
        )
        return _STATUS[int(result)]

    @staticmethod
    def _claim_args(lease_ms: int, now_ms: int, generation: int = 0) -> list[int]:
        return [int(now_ms), int(now_ms) + int(lease_ms), max(1, int(lease_ms)), int(generation)]

    def cancel(
        self, key: str, *, now_ms: int, generation: int = CANCELLED_GENERATION
    ) -> CancelStatus:
        return self.cancel_batch([Cancel(key, now_ms, generation)])[0]

    def cancel_batch(self, ops: Sequence[Cancel]) -> list[CancelStatus]:
        """``ops`` in one pipeline (one round trip); each is its own atomic script."""
        for op in ops:
            check_cancel(op)
        pipe = self._client.pipeline(transaction=False)
        for op in ops:
            args = [op.now_ms, op.generation, self.retention_ms or 0, CANCELLED_GENERATION]
            self._cancel(keys=[self._key(op.key)], args=args, client=pipe)
        return [_CANCEL_STATUS[int(reply)] for reply in pipe.execute()]

    def uncancel_batch(
        self, keys: Sequence[str], *, now_ms: int, look_only: bool = False
    ) -> list[UncancelStatus]:
        """Remove cancels' marks in one pipeline, each key its own atomic script (see
        :mod:`delayq.stores.uncancel`); ``look_only``: remove nothing."""
        check_uncancel(keys, now_ms)
        pipe = self._client.pipeline(transaction=False)
        args = [int(now_ms), CANCELLED_GENERATION, 1 if look_only else 0]
        for key in keys:
            self._uncancel(keys=[self._key(key)], args=args, client=pipe)
        return [_UNCANCEL_STATUS[int(reply)] for reply in pipe.execute()]

    def complete(self, key: str, *, now_ms: int) -> None:
        self._complete(keys=[self._key(key)], args=self._complete_args(now_ms))

    def _complete_args(self, now_ms: int) -> list[int]:
        return [int(now_ms), self.retention_ms or 0]

    def release(self, key: str) -> None:
        self._release(keys=[self._key(key)])

    def run_batch(self, ops: Sequence[StoreOp]) -> list[ClaimStatus | None]:
        """``ops`` in one pipeline (one round trip); each is still its own atomic script."""
        pipe = self._client.pipeline(transaction=False)
        for op in ops:
            name = [self._key(op.key)]
            if isinstance(op, Claim):
                args = self._claim_args(op.lease_ms, op.now_ms, op.generation)
                self._claim(keys=name, args=args, client=pipe)
            elif isinstance(op, Complete):
                self._complete(keys=name, args=self._complete_args(op.now_ms), client=pipe)
            else:
                self._release(keys=name, client=pipe)
        replies = pipe.execute()
        return [
            _STATUS[int(reply)] if isinstance(op, Claim) else None
            for op, reply in zip(ops, replies, strict=True)
        ]

    def done_keys(self) -> Iterator[tuple[str, int]]:
        """Every completed key (prefix removed) and when, a ``SCAN`` page at a time."""
        batch: list[bytes | str] = []
        for name in self._scan():
            batch.append(name)
            if len(batch) >= _PRUNE_BATCH:
                yield from self._done_page(batch)
                batch = []
        if batch:
            yield from self._done_page(batch)

    def _done_page(self, names: list[bytes | str]) -> Iterator[tuple[str, int]]:
        pipe = self._client.pipeline(transaction=False)
        for name in names:
            pipe.hget(name, "done_at")
        # A key of another type under the prefix (not ours) answers an error: skipped.
        for name, done_at in zip(names, pipe.execute(raise_on_error=False), strict=True):
            if done_at is None or isinstance(done_at, Exception):
                continue
            text = name.decode("utf-8", "surrogateescape") if isinstance(name, bytes) else name
            yield text[len(self.prefix) :], int(done_at)

    def _scan(self) -> Iterator[bytes | str]:
        if self._closed:
            raise closed_error(self)
        yield from self._client.scan_iter(match=_glob_escape(self.prefix) + "*", count=_PRUNE_BATCH)

    def prune(self, *, older_than_ms: int) -> int:
        """Delete keys completed before ``older_than_ms`` and claims whose lease ended
        before it. Keys that Redis expired by their TTL are not counted."""
        removed = 0
        batch: list[bytes | str] = []
        for name in self._scan():
            batch.append(name)
            if len(batch) >= _PRUNE_BATCH:
                removed += self._prune_batch(batch, older_than_ms)
                batch = []
        if batch:
            removed += self._prune_batch(batch, older_than_ms)
        return removed

    def _prune_batch(self, names: list[bytes | str], older_than_ms: int) -> int:
        pipe = self._client.pipeline(transaction=False)
        for name in names:
            self._prune(keys=[name], args=[int(older_than_ms)], client=pipe)
        return sum(int(n) for n in pipe.execute())

    def close(self) -> None:
        """Close the client this store made; the store refuses any further call."""
        self._closed = True
        if self._own_client:
            self._client.close()
