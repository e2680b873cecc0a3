"""Byte quotas per user, Kafka's kind (issue 27): produce and consume bytes per second for each
user (and a default), kept as a token bucket per user and flow; going over yields how long to
hold the user's next request (throttle ms), never an error.

Pure: no sockets, clocks or locks (time comes in as `now_ms`; a caller shared by threads holds
its own lock), and it never refuses or drops a request.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

ANONYMOUS = ""  # the user of a connection that did not authenticate (auth off)
OTHER = "_other"  # past max_users, new users share this bucket (bounded state)


class Flow(enum.Enum):
    PRODUCE = "produce"
    CONSUME = "consume"


def parse_user_rates(text: str, what: str) -> dict[str, int]:
    """`"alice=1048576, bob=0"` -> {alice: 1048576, bob: 0} (0 = no quota for that user, even
    with a default). ValueError names the setting and the form to write."""
    rates: dict[str, int] = {}
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        user, sep, value = item.partition("=")
        user, value = user.strip(), value.strip()
        if not sep or not user or not value.isdigit():
            raise ValueError(
                f"{what}: {item!r} is not USER=BYTES_PER_SECOND (e.g. 'alice=1048576,bob=0'; "
                "0 = no quota for that user)"
            )
        if user in rates:
            raise ValueError(f"{what}: user {user!r} is given twice")
        rates[user] = int(value)
    return rates


@dataclass(frozen=True, slots=True)
class QuotaTable:
    """One flow's quotas: `default` for every user not in `by_user` (0 = none)."""

    default: int = 0
    by_user: Mapping[str, int] = field(default_factory=dict)

    def rate(self, user: str) -> int:
        return self.by_user.get(user, self.default)

    @property
    def enabled(self) -> bool:
        return self.default > 0 or any(v > 0 for v in self.by_user.values())


@dataclass(slots=True)
class _Bucket:
    credit: float  # bytes the user may still move at once; negative = owed (throttled)
    at_ms: int  # when `credit` was last brought up to date


@dataclass(slots=True)
class UserUsage:
    """What one user moved on one flow, for metrics (monotonic counters)."""

    bytes: int = 0
    throttle_ms: int = 0  # time its requests were held
    throttled: int = 0  # requests held


class ByteQuotas:
    """Token buckets of bytes per (user, flow). A bucket holds at most `burst_ms` of its rate
    and fills at the rate. A request is served once its user owes nothing (`owed_ms` is how
    long to hold it until then), and is charged what it moved when served, even past the
    credit (its size is known only then: a pull's answer): the debt is what holds the user's
    next request. So a user whose requests wait their turn moves at most its burst plus its
    rate over time, plus what its requests served at one instant moved. A debt is capped at
    `max_throttle_ms` of the rate (the bytes beyond are forgiven, as Kafka caps its throttle)."""

    def __init__(
        self,
        tables: Mapping[Flow, QuotaTable],
        *,
        burst_ms: int = 1000,
        max_throttle_ms: int = 30_000,
        max_users: int = 10_000,
    ) -> None:
        if burst_ms < 1 or max_throttle_ms < 1 or max_users < 1:
            raise ValueError("burst_ms, max_throttle_ms and max_users must be >= 1")
        self.tables = {f: tables.get(f, QuotaTable()) for f in Flow}
        self.burst_ms = burst_ms
        self.max_throttle_ms = max_throttle_ms
        self.max_users = max_users
        self._buckets: dict[tuple[str, Flow], _Bucket] = {}
        self.usage: dict[tuple[str, Flow], UserUsage] = {}

    @property
    def enabled(self) -> bool:
        return any(t.enabled for t in self.tables.values())

    def owed_ms(self, flow: Flow, user: str, now_ms: int) -> int:
        """How long `user`'s next request on `flow` must wait (0 = serve it now)."""
        key = (user, flow)
        if key not in self.usage and self._users() >= self.max_users:
            key = (OTHER, flow)
        bucket = self._buckets.get(key)
        rate = self.tables[flow].rate(user)
        if bucket is None or rate <= 0:
            return 0
        credit = bucket.credit + max(0, now_ms - bucket.at_ms) * rate / 1000
        return 0 if credit >= 0 else math.ceil(-credit * 1000 / rate)

    def charge(self, flow: Flow, user: str, nbytes: int, now_ms: int) -> int:
        """Count `nbytes` moved for `user` by a request served now; what it then owes (ms)."""
        rate = self.tables[flow].rate(user)
        key = self._key(user, flow, now_ms)
        usage = self.usage.get(key)
        if usage is None:
            usage = self.usage[key] = UserUsage()
        usage.bytes += nbytes
        if rate <= 0:
            return 0
        burst = rate * self.burst_ms / 1000
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket(burst, now_ms)
        # A clock that steps back adds nothing (and takes nothing).
        elapsed = max(0, now_ms - bucket.at_ms)
        bucket.credit = min(burst, bucket.credit + elapsed * rate / 1000) - nbytes
        bucket.at_ms = max(bucket.at_ms, now_ms)
        bucket.credit = max(bucket.credit, -rate * self.max_throttle_ms / 1000)
        return 0 if bucket.credit >= 0 else math.ceil(-bucket.credit * 1000 / rate)

    def note_held(self, flow: Flow, user: str, held_ms: int) -> None:
        """Count a request of `user` held `held_ms` for its quota (metrics)."""
        key = (user, flow)
        if key not in self.usage:
            key = (OTHER, flow)
        usage = self.usage.setdefault(key, UserUsage())
        usage.throttle_ms += held_ms
        usage.throttled += 1

    def _key(self, user: str, flow: Flow, now_ms: int) -> tuple[str, Flow]:
        key = (user, flow)
        if key in self.usage:
            return key
        if self._users() >= self.max_users:
            self._forget_idle(now_ms)
            if self._users() >= self.max_users:
                return (OTHER, flow)
        return key

    def _users(self) -> int:
        shared = sum((OTHER, f) in self.usage for f in Flow)
        return len(self.usage) - shared

    def _forget_idle(self, now_ms: int) -> None:
        """Drop the buckets that are full again: they would start the same as a new one. Their
        usage counters go too (a counter reset to Prometheus, which rate() handles)."""
        for key, bucket in list(self._buckets.items()):
            if key[0] == OTHER:
                continue
            rate = self.tables[key[1]].rate(key[0])
            refilled = bucket.credit + max(0, now_ms - bucket.at_ms) * rate / 1000
            if refilled >= rate * self.burst_ms / 1000:
                del self._buckets[key]
                self.usage.pop(key, None)
        for key in [k for k in self.usage if k not in self._buckets and k[0] != OTHER]:
            del self.usage[key]  # users without a quota keep no bucket: idle by definition
