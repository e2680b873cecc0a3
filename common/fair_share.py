"""Fair shares of what a server holds open for its clients (connections, or calls in flight):
a global cap, and a cap per client address and per authenticated user, so that one client cannot
take what the others need (issue 27).

Counting only: no sockets, no clocks, no locks (a caller shared by threads holds its own); and
the settings keys every server role shares for it.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

from raftmq.common.auth import AuthSettings
from raftmq.common.errors import ThrottledError
from raftmq.common.settings import setting, settings_class


@dataclass(frozen=True, slots=True)
class ShareLimits:
    """`total` over every client; `per_address` per client host; `per_user` per principal
    (0 = no cap of that kind). What is counted is named by `what` in the refusals."""

    total: int
    per_address: int
    per_user: int = 0
    what: str = "connections"

    def __post_init__(self) -> None:
        for name in ("total", "per_address", "per_user"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if self.total < 1:
            raise ValueError("total must be >= 1")


def client_host(peer: object) -> str:
    """The host part of a peer address: an asyncio peername tuple, "host:port", "[v6]:port", or
    gRPC's "ipv4:host:port" / "ipv6:[v6]:port" (the port differs per connection, the host not)."""
    if isinstance(peer, tuple):
        return str(peer[0])
    text = str(peer)
    for scheme in ("ipv4:", "ipv6:"):
        if text.startswith(scheme):
            text = text[len(scheme) :]
    host, sep, _port = text.rpartition(":")
    if not sep:
        return text
    return host.strip("[]")


class FairShare:
    """Admits and releases holders by client host and by user. Every admit that returned None
    is matched by exactly one release with the same key."""

    def __init__(self, limits: ShareLimits) -> None:
        self.limits = limits
        self.total = 0
        self._by_host: collections.Counter[str] = collections.Counter()
        self._by_user: collections.Counter[str] = collections.Counter()
        self.refused = 0

    def held_by(self, host: str) -> int:
        return self._by_host[host]

    def held_by_user(self, user: str) -> int:
        return self._by_user[user]

    def admit(self, host: str) -> ThrottledError | None:
        """Take one unit for `host`, or say why not (nothing is taken then)."""
        lim = self.limits
        if self.total >= lim.total:
            self.refused += 1
            return ThrottledError(
                f"the server holds {self.total} {lim.what}, its limit; retry later"
            )
        if lim.per_address and self._by_host[host] >= lim.per_address:
            self.refused += 1
            return ThrottledError(
                f"{host} already holds {self._by_host[host]} {lim.what}, the limit per client "
                f"address; close some (one client per process shares its {lim.what}) or raise "
                "the server's limit per address"
            )
        self.total += 1
        self._by_host[host] += 1
        return None

    def release(self, host: str) -> None:
        assert self._by_host[host] > 0 and self.total > 0, f"release without admit: {host}"
        self.total -= 1
        self._by_host[host] -= 1
        if not self._by_host[host]:
            del self._by_host[host]

    def admit_user(self, user: str) -> ThrottledError | None:
        """Take one unit for an authenticated `user` (on top of its host's)."""
        lim = self.limits
        if lim.per_user and self._by_user[user] >= lim.per_user:
            self.refused += 1
            return ThrottledError(
                f"user {user!r} already holds {self._by_user[user]} {lim.what}, the limit per "
                f"user; close some or raise the server's limit per user"
            )
        self._by_user[user] += 1
        return None

    def release_user(self, user: str) -> None:
        assert self._by_user[user] > 0, f"release without admit: user {user}"
        self._by_user[user] -= 1
        if not self._by_user[user]:
            del self._by_user[user]


@settings_class
class FairShareSettings(AuthSettings):
    """The keys every server role shares beyond [security.auth]'s (its base): a client host's
    share of the role's gRPC port and of its HTTP port (issue 27)."""

    rpc_max_calls_per_address: int = setting(
        default=0,
        unit="calls",
        doc="gRPC calls one client host may have running (past it: THROTTLED); 0 = all but an "
        "eighth of the role's handler threads",
    )
    http_max_connections_per_address: int = setting(
        default=16,
        unit="connections",
        doc="/metrics, /healthz and /readyz: connections one client host may hold (a scraper "
        "needs one); one without a whole request for 10 s is closed",
    )


def check_fair_share_settings(settings: FairShareSettings) -> None:
    if settings.rpc_max_calls_per_address < 0:
        raise ValueError("rpc_max_calls_per_address must be >= 0 (0 = 7/8 of handler threads)")
    if settings.http_max_connections_per_address < 1:
        raise ValueError("http_max_connections_per_address must be >= 1")
