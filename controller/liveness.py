"""Liveness of broker nodes as the controller leader sees it, pure: when each (group, node) last
reported its role and since when it has reported without a gap. Soft state, like the NameServer's
routes: not replicated, rebuilt from the brokers' heartbeat reports after a controller failover
(until then no node counts as alive, so the balancer waits). No clock is read here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

MAX_TRACKED = 10_000 * 64  # controller.state's MAX_GROUPS x MAX_MEMBERS


@dataclass(frozen=True, slots=True)
class Seen:
    last_ms: int  # the latest report
    since_ms: int  # the first report after the latest gap longer than alive_ms

    def alive(self, now_ms: int, alive_ms: int) -> bool:
        return 0 <= now_ms - self.last_ms <= alive_ms

    def up_for_ms(self, now_ms: int) -> int:
        return now_ms - self.since_ms


class Liveness:
    """`observe` every role report; `view()` is what the balancing policy reads."""

    def __init__(self, alive_ms: int) -> None:
        if alive_ms <= 0:
            raise ValueError("alive_ms must be > 0")
        self.alive_ms = alive_ms
        self._seen: dict[tuple[str, str], Seen] = {}

    def observe(self, group: str, node_id: str, now_ms: int) -> Seen:
        key = (group, node_id)
        prev = self._seen.get(key)
        if prev is None and len(self._seen) >= MAX_TRACKED:
            self._forget_dead(now_ms)
            if len(self._seen) >= MAX_TRACKED:
                raise OverflowError(f"more than {MAX_TRACKED} broker nodes report")
        if prev is None or not prev.alive(now_ms, self.alive_ms):
            seen = Seen(now_ms, now_ms)  # new, or back after a silence: a fresh streak
        else:
            seen = Seen(max(prev.last_ms, now_ms), prev.since_ms)
        self._seen[key] = seen
        return seen

    def view(self) -> Mapping[tuple[str, str], Seen]:
        return dict(self._seen)

    def _forget_dead(self, now_ms: int) -> None:
        for key in [k for k, s in self._seen.items() if not s.alive(now_ms, self.alive_ms)]:
            del self._seen[key]
