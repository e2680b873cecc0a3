"""Consumer group membership on a broker node (RocketMQ's ConsumerManager), as a pure value
holder: heartbeats in, sorted live members out. Time is passed in; nothing here is replicated
(membership is soft state that heartbeats rebuild within one interval)."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_EXPIRY_MS = 30_000
MIN_EXPIRY_MS = 1_000  # a shorter one would drop a member between two of its heartbeats
MAX_EXPIRY_MS = 600_000


@dataclass(slots=True)
class _Member:
    topics: tuple[str, ...]
    expires_ms: int


class RegistryFullError(Exception):
    """Too many groups or clients; the bound protects the broker's memory."""


class ConsumerRegistry:
    def __init__(self, *, max_groups: int = 10_000, max_clients_per_group: int = 10_000) -> None:
        self._max_groups = max_groups
        self._max_clients = max_clients_per_group
        self._groups: dict[str, dict[str, _Member]] = {}

    def heartbeat(
        self, group: str, client_id: str, topics: tuple[str, ...], expiry_ms: int, now_ms: int
    ) -> None:
        expiry = min(max(expiry_ms or DEFAULT_EXPIRY_MS, MIN_EXPIRY_MS), MAX_EXPIRY_MS)
        members = self._groups.get(group)
        if members is None:
            self._expire(now_ms)
            if len(self._groups) >= self._max_groups:
                raise RegistryFullError(f"{self._max_groups} consumer groups already registered")
            members = self._groups[group] = {}
        if client_id not in members and len(members) >= self._max_clients:
            self._expire_group(group, now_ms)
            members = self._groups.setdefault(group, {})  # expiry may have dropped the group
            if len(members) >= self._max_clients:
                raise RegistryFullError(f"group {group!r} has {self._max_clients} clients already")
        members[client_id] = _Member(topics, now_ms + expiry)

    def leave(self, group: str, client_id: str) -> bool:
        members = self._groups.get(group)
        if members is None or members.pop(client_id, None) is None:
            return False
        if not members:
            del self._groups[group]
        return True

    def members(self, group: str, now_ms: int) -> list[str]:
        self._expire_group(group, now_ms)
        return sorted(self._groups.get(group, {}))

    def snapshot(self, now_ms: int) -> dict[str, dict[str, tuple[str, ...]]]:
        """Every live group -> client id -> the topics it subscribes (admin, metrics)."""
        self._expire(now_ms)
        return {g: {c: m.topics for c, m in ms.items()} for g, ms in self._groups.items()}

    def _expire_group(self, group: str, now_ms: int) -> None:
        members = self._groups.get(group)
        if members is None:
            return
        for cid in [c for c, m in members.items() if m.expires_ms <= now_ms]:
            del members[cid]
        if not members:
            del self._groups[group]

    def _expire(self, now_ms: int) -> None:
        for group in list(self._groups):
            self._expire_group(group, now_ms)
