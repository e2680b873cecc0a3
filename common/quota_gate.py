"""The servers' one shell of the byte quotas (common/quota.py): the settings keys of every role
that enforces them (broker, proxy), a server's book behind a lock, the clock, and the hold before
a request is served: on asyncio (a held request holds no thread), or on a gRPC handler thread
(at most a few per user, so that a throttled user never takes the threads others need).

Never errs for a quota while it may hold: a request waits its user's turn for at most its budget,
then is served; what it moved is charged after. Only a threaded call of a user already holding
its share of threads is refused at once (THROTTLED, with the wait), as a connection limit is.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Generator, Mapping

from raftmq.common.errors import ThrottledError
from raftmq.common.fair_share import FairShare, ShareLimits
from raftmq.common.quota import ByteQuotas, Flow, QuotaTable, UserUsage, parse_user_rates
from raftmq.common.scrape_access import ScrapeSettings, check_scrape_settings
from raftmq.common.settings import setting, settings_class


@settings_class
class QuotaSettings(ScrapeSettings):
    """The quota keys of the roles that serve clients' bytes, beyond the scrape's (its base)."""

    quota_produce_bytes_per_s: int = setting(
        default=0,
        unit="bytes/s",
        doc="each user's produce quota (broker: its sends, framed and gRPC, one book; proxy: "
        "SendMessage; auth off: all clients are one user); over it answers are held, not "
        "refused, and say for how long; 0 = none",
    )
    quota_consume_bytes_per_s: int = setting(
        default=0,
        unit="bytes/s",
        doc="each user's consume quota (broker: pull answers; proxy: ReceiveMessage, the POP "
        "path), as the produce one",
    )
    quota_produce_by_user: str = setting(
        default="",
        unit="",
        doc="produce quotas of named users over the default, 'alice=1048576,bob=0' (0 = none)",
    )
    quota_consume_by_user: str = setting(
        default="",
        unit="",
        doc="consume quotas of named users over the default, as quota_produce_by_user",
    )

    def __post_init__(self) -> None:  # a role's own __post_init__ calls the check itself
        check_quota_settings(self)

    def quota_tables(self) -> dict[Flow, QuotaTable]:
        """The byte quotas per flow (issue 27)."""
        return {
            Flow.PRODUCE: QuotaTable(
                self.quota_produce_bytes_per_s,
                parse_user_rates(self.quota_produce_by_user, "quota_produce_by_user"),
            ),
            Flow.CONSUME: QuotaTable(
                self.quota_consume_bytes_per_s,
                parse_user_rates(self.quota_consume_by_user, "quota_consume_by_user"),
            ),
        }


def check_quota_settings(s: QuotaSettings) -> None:
    check_scrape_settings(s)
    s.quota_tables()  # a malformed quota names its setting here
    if s.quota_produce_bytes_per_s < 0 or s.quota_consume_bytes_per_s < 0:
        raise ValueError("quota_produce/consume_bytes_per_s must be >= 0 (0 = no quota)")


# How long a call was held for its user's byte quota (issue 27), in the call's trailing metadata
# (the proxy's v2 answers and the broker's gRPC ones; Kafka's throttle_time_ms).
THROTTLE_KEY = "x-raftmq-throttle-ms"


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


@dataclasses.dataclass(frozen=True, slots=True)
class ThreadHold:
    """What `QuotaGate.hold` did: `held_ms` on the calling thread; `owed_ms` still owed after it
    (0 = the call's turn came); `refused` when the user already held its share of threads (then
    nothing was held: the caller answers at once, telling the wait)."""

    held_ms: int
    owed_ms: int
    refused: ThrottledError | None = None


class QuotaGate:
    """One server's quotas: `await turn(...)` (asyncio) or `hold(...)` (a handler thread) before
    serving a request, `charge(...)` after. `max_held_threads` (over all users) and
    `max_held_threads_per_user` bound the threads `hold` may keep asleep at once."""

    def __init__(
        self,
        tables: Mapping[Flow, QuotaTable],
        *,
        max_held_threads: int = 1,
        max_held_threads_per_user: int = 1,
    ) -> None:
        self.quotas = ByteQuotas(tables)
        self._lock = threading.Lock()  # the book is read by the metrics scrape's thread
        self._threads = FairShare(
            ShareLimits(
                max_held_threads,
                0,
                max_held_threads_per_user,
                what="handler threads held for its quota",
            )
        )

    @property
    def enabled(self) -> bool:
        return self.quotas.enabled

    @property
    def held_threads(self) -> int:
        """Threads `hold` keeps asleep now (a gauge)."""
        with self._lock:
            return self._threads.total

    @property
    def refused_holds(self) -> int:
        """Calls `hold` refused since start: their user (or all users) held its share."""
        with self._lock:
            return self._threads.refused

    def _waits(self, flow: Flow, user: str, budget_ms: int) -> Generator[int, None, int]:
        """The waits (ms) of a request held until `user` owes nothing on `flow`, within
        `budget_ms`; returns what it still owes then (0 = its turn came). Both holds drive it."""
        quotas, held = self.quotas, 0
        while True:
            with self._lock:
                owed = quotas.owed_ms(flow, user, _now_ms())
            if not owed or held >= budget_ms:
                return owed
            wait = min(owed, budget_ms - held)
            yield wait
            held += wait

    def _note(self, flow: Flow, user: str, held_ms: int) -> None:
        if held_ms:
            with self._lock:
                self.quotas.note_held(flow, user, held_ms)

    async def turn(self, flow: Flow, user: str, budget_ms: int) -> tuple[int, bool]:
        """Hold a request until `user` owes nothing on `flow` (Kafka's way: a delay, never an
        error), for at most `budget_ms` so that no client's call times out for it: (ms held,
        whether its turn came)."""
        if not self.quotas.enabled:
            return 0, True
        held, waits = 0, self._waits(flow, user, budget_ms)
        try:
            while True:
                wait = next(waits)
                await asyncio.sleep(wait / 1000)
                held += wait
        except StopIteration as done:
            owed: int = done.value
        self._note(flow, user, held)
        return held, not owed

    def hold(
        self, flow: Flow, user: str, budget_ms: int, wake: threading.Event | None = None
    ) -> ThreadHold:
        """`turn` for a threaded server: the calling thread sleeps, while the user holds fewer
        than its share of threads (else refused at once, nothing held). `wake` (set when the
        call ends: cancelled, or the server stopping) ends the hold early."""
        if not self.quotas.enabled:
            return ThreadHold(0, 0)
        with self._lock:
            owed = self.quotas.owed_ms(flow, user, _now_ms())
        if not owed or budget_ms <= 0:
            return ThreadHold(0, owed)
        refused = self._take_thread(user, owed)
        if refused is not None:
            return ThreadHold(0, owed, refused)
        held, waits = 0, self._waits(flow, user, budget_ms)
        event = wake if wake is not None else threading.Event()
        try:
            while True:
                try:
                    wait = next(waits)
                except StopIteration as done:
                    owed = done.value
                    break
                if event.wait(wait / 1000):  # the call is over: nobody waits for its answer
                    waits.close()
                    with self._lock:
                        owed = self.quotas.owed_ms(flow, user, _now_ms())
                    break
                held += wait
        finally:
            with self._lock:
                self._threads.release_user(user)
                self._threads.release("")
        self._note(flow, user, held)
        return ThreadHold(held, owed)

    def _take_thread(self, user: str, owed_ms: int) -> ThrottledError | None:
        """One held thread for `user`, or why not: its share, or every user's, is held."""
        with self._lock:
            over_all = self._threads.admit("")
            over_user = None if over_all is not None else self._threads.admit_user(user)
            if over_user is not None:
                self._threads.release("")
        if over_all is None and over_user is None:
            return None
        lim = self._threads.limits
        whose = (
            f"{lim.total} calls of users over their quotas"
            if over_all is not None
            else f"{lim.per_user} calls of {user!r}"
        )
        return ThrottledError(
            f"user {user!r} is over its byte quota for {owed_ms} ms more, and this server "
            f"already holds {whose} until then: wait retry_after_ms, and send fewer calls at once",
            details={"user": user, "retry_after_ms": str(owed_ms)},
        )

    def charge(self, flow: Flow, user: str, nbytes: int) -> None:
        """Count what a request served moved for its user (what it owes holds the next one);
        counted with no quota too, for the per-user metrics."""
        with self._lock:
            self.quotas.charge(flow, user, nbytes, _now_ms())

    def usage(self) -> list[tuple[str, str, UserUsage]]:
        """(user, flow, counters) of every user the book holds, for the metrics."""
        with self._lock:
            return [
                (user, flow.value, dataclasses.replace(u))
                for (user, flow), u in self.quotas.usage.items()
            ]
