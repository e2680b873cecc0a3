"""The servers' one shell of the byte quotas (common/quota.py): the settings keys of every role
that enforces them (broker, proxy), a server's book behind a lock, the clock, and the hold before
a request is served, on asyncio (a held request holds no thread).

Never refuses and never errs for a quota: a request waits its user's turn for at most its
budget, then is served; what it moved is charged after.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Mapping

from raftmq.common.quota import ByteQuotas, Flow, QuotaTable, UserUsage, parse_user_rates
from raftmq.common.scrape_access import ScrapeSettings, check_scrape_settings
from raftmq.common.settings import setting, settings_class


@settings_class
class QuotaSettings(ScrapeSettings):
    """The quota keys of the roles that serve clients' bytes, beyond the scrape's (its base)."""

    quota_produce_bytes_per_s: int = setting(
        default=0,
        unit="bytes/s",
        doc="each user's produce quota (broker: the framed data path; proxy: SendMessage; auth "
        "off: all clients are one user); over it answers are held, not refused, and say for "
        "how long; 0 = none",
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


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


class QuotaGate:
    """One server's quotas: `await turn(...)` before serving a request, `charge(...)` after."""

    def __init__(self, tables: Mapping[Flow, QuotaTable]) -> None:
        self.quotas = ByteQuotas(tables)
        self._lock = threading.Lock()  # the book is read by the metrics scrape's thread

    @property
    def enabled(self) -> bool:
        return self.quotas.enabled

    async def turn(self, flow: Flow, user: str, budget_ms: int) -> tuple[int, bool]:
        """Hold a request until `user` owes nothing on `flow` (Kafka's way: a delay, never an
        error), for at most `budget_ms` so that no client's call times out for it: (ms held,
        whether its turn came)."""
        quotas, held, owed = self.quotas, 0, 0
        if not quotas.enabled:
            return 0, True
        while True:
            with self._lock:
                owed = quotas.owed_ms(flow, user, _now_ms())
            if not owed or held >= budget_ms:
                break
            wait = min(owed, budget_ms - held)
            await asyncio.sleep(wait / 1000)
            held += wait
        if held:
            with self._lock:
                quotas.note_held(flow, user, held)
        return held, not owed

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
