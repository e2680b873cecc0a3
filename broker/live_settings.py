"""Which broker settings change without a restart (mqadmin's updateBrokerConfig, issue 26):
the plan for a request, values in and out, all or nothing. Each live key is read where it is
used at every use (the retention thread at each check, logging's root level); every other key
is read once at start (it binds a port, sizes a map, builds a component), so it is refused with
that reason. Never persisted: a restart starts from the cluster description again."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, fields

from raftmq.broker.settings import BrokerSettings
from raftmq.common.settings import SettingsError, changed, secret_keys

# key -> where it takes effect (the answer says so)
LIVE = {
    "retention_ms": "at the retention thread's next check",
    "retention_bytes": "at the retention thread's next check",
    "retention_check_interval_ms": "after the retention thread's current wait",
    "max_store_bytes": "at the disk guard's next check (within 1 s)",
    "disk_max_used_ratio": "at the disk guard's next check (within 1 s)",
    "log_level": "at once",
    "accept_sends": "at once for sends; routes at the next registration (heartbeat_interval_ms)",
}
MAX_KEYS = 64  # per request


@dataclass(frozen=True, slots=True)
class LivePlan:
    settings: BrokerSettings  # the settings to run with (the current ones when refused)
    applied: dict[str, str]  # key -> value, as it will read in `broker status --config`
    refused: dict[str, str]  # key -> why; non-empty: nothing changes


def plan(current: BrokerSettings, updates: Mapping[str, str]) -> LivePlan:
    known = {f.name for f in fields(BrokerSettings)}
    refused: dict[str, str] = {}
    if len(updates) > MAX_KEYS:
        return LivePlan(current, {}, {"*": f"at most {MAX_KEYS} settings per request"})
    for key in updates:
        if key not in known:
            refused[key] = "no such broker setting (`raftmq broker status --config` lists them)"
        elif key not in LIVE:
            refused[key] = (
                "read once when the node starts; set it in the cluster description's "
                "[settings.broker] and restart the node (live: " + ", ".join(sorted(LIVE)) + ")"
            )
    if refused:
        return LivePlan(current, {}, refused)
    try:
        new = changed(current, updates)
    except SettingsError as exc:
        return LivePlan(current, {}, {key: str(exc) for key in updates})
    hidden = secret_keys(BrokerSettings)
    return LivePlan(
        new,
        {k: "<secret>" if k in hidden else str(getattr(new, k)) for k in updates},
        {},
    )


def take_effect(before: BrokerSettings, after: BrokerSettings) -> None:
    """What does not read the node's settings at each use: logging's root level."""
    if after.log_level != before.log_level:
        logging.getLogger().setLevel(after.log_level.upper())
