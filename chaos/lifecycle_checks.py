"""Checkers for the message-lifecycle chaos scenarios (issue 16): pure functions from a history
(chaos/history.py) to verdicts, like chaos/checkers.py, whose queue/order/availability checks run
on the same histories beside these. What each workload mode records (chaos/lifecycle_workload.py):

- `txn`: a send is a whole transaction: invoke `{"id", "intent"}` where intent is `commit`,
  `rollback` (the local transaction's answer) or `check-commit` / `check-rollback` (it answers
  UNKNOWN and the checker decides at check-back); the completion carries `"half": true` once the
  half message was stored. Check-backs are `event` ops `{"kind": "check", "id", "answer"}`.
- `delay`: invoke `{"id", "delay_ms"}`; deliveries carry `queue` and `offset`.
- `retry`: deliveries to a push consumer's listener `{"id", "reconsume", "result": "later"|"ok"}`
  (the listener fails the first attempts of every message on purpose).
- `orderly`: deliveries to an orderly listener `{"id", "key", "queue", "offset", "start", "end"}`.

Times are the history's one monotonic clock; no clock is read here."""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from raftmq.chaos.history import Op

Mode = Literal["queue", "txn", "delay", "retry", "orderly", "proxy"]
MODES: tuple[str, ...] = get_args(Mode)
COMMIT_INTENTS = frozenset({"commit", "check-commit"})
ROLLBACK_INTENTS = frozenset({"rollback", "check-rollback"})
# The broker's due time is its store time (ms, floored) plus the delay; the store comes after the
# client's invoke, so a delivery before invoke + delay is early. The tolerance covers the ms floor
# and the wall clock (broker) against the monotonic clock (history) of one machine.
EARLY_TOLERANCE_S = 0.010
SAMPLE = 10


def _sample(ids: Iterable[str]) -> list[str]:
    return heapq.nsmallest(SAMPLE, ids)


@dataclass(frozen=True, slots=True)
class LifecycleResult:
    """One mode's verdict. `lost`: promised, never delivered (txn: committed; delay: acknowledged;
    retry: acknowledged yet never consumed successfully; orderly: see the queue checker).
    `half_delivered`: a rolled-back (or never ended) transaction's message was delivered.
    `early`: a delayed message (or a retry) delivered before it was due. `delivered_twice`: a
    delayed message stored into its topic more than once (two positions; a consumer's re-read
    of one position is legal). `overlap`: an orderly listener got a queue's next message before
    it returned from the one before. valid = all five are zero."""

    mode: str
    promised: int = 0
    delivered: int = 0
    lost: int = 0
    half_delivered: int = 0
    early: int = 0
    delivered_twice: int = 0
    overlap: int = 0
    checks: int = 0  # txn: check-backs answered by the workload
    retries: int = 0  # retry: deliveries with reconsume > 0
    worst_early_s: float = 0.0
    samples: dict[str, list[str]] = field(default_factory=dict)

    @property
    def valid(self) -> bool:
        return (
            self.lost == 0
            and self.half_delivered == 0
            and self.early == 0
            and self.delivered_twice == 0
            and self.overlap == 0
        )

    def summary(self) -> str:
        parts = [f"{self.mode}: {self.promised} promised", f"{self.lost} lost"]
        if self.mode == "txn":
            parts += [f"{self.half_delivered} half delivered", f"{self.checks} check-backs"]
        if self.mode in ("delay", "retry"):
            parts.append(f"{self.early} early")
        if self.mode == "delay":
            parts.append(f"{self.delivered_twice} delivered twice")
        if self.mode == "retry":
            parts.append(f"{self.retries} retries")
        if self.mode == "orderly":
            parts.append(f"{self.overlap} overlap")
        return ", ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "valid": self.valid,
            "summary": self.summary(),
            "promised": self.promised,
            "delivered": self.delivered,
            "lost": self.lost,
            "half_delivered": self.half_delivered,
            "early": self.early,
            "delivered_twice": self.delivered_twice,
            "overlap": self.overlap,
            "checks": self.checks,
            "retries": self.retries,
            "worst_early_s": round(self.worst_early_s, 3),
            "samples": self.samples,
        }


@dataclass(slots=True)
class _Send:
    invoke: float | None = None
    value: dict[str, Any] = field(default_factory=dict)
    outcome: str | None = None
    done_value: dict[str, Any] = field(default_factory=dict)


def _sends(ops: Sequence[Op]) -> dict[str, _Send]:
    out: dict[str, _Send] = {}
    for op in ops:
        if op.f != "send" or not isinstance(op.value.get("id"), str):
            continue
        s = out.setdefault(op.value["id"], _Send())
        if op.type == "invoke":
            s.invoke, s.value = op.time, op.value
        elif s.outcome is None:
            s.outcome, s.done_value = op.type, op.value
    return out


def _recvs(ops: Sequence[Op]) -> list[Op]:
    out = [op for op in ops if op.f == "recv" and op.type == "ok" and "id" in op.value]
    out.sort(key=lambda op: op.time)
    return out


def check_txn(ops: Sequence[Op]) -> LifecycleResult:
    """Committed (by the local transaction or at check-back) and stored as a half message: must
    be delivered. Rolled back: must never be. The intent is fixed when the send is invoked, and
    the workload's checker answers check-backs from it, so either outcome is known up front."""
    sends = _sends(ops)
    delivered = {op.value["id"] for op in _recvs(ops)}
    promised = {
        i
        for i, s in sends.items()
        if s.value.get("intent") in COMMIT_INTENTS and s.done_value.get("half")
    }
    rolled_back = {i for i, s in sends.items() if s.value.get("intent") in ROLLBACK_INTENTS}
    lost = promised - delivered
    half = rolled_back & delivered
    checks = sum(1 for op in ops if op.f == "event" and op.value.get("kind") == "check")
    return LifecycleResult(
        "txn",
        promised=len(promised),
        delivered=len(delivered),
        lost=len(lost),
        half_delivered=len(half),
        checks=checks,
        samples={"lost": _sample(lost), "half_delivered": _sample(half)},
    )


def check_delay(ops: Sequence[Op], tolerance_s: float = EARLY_TOLERANCE_S) -> LifecycleResult:
    """Each acknowledged delayed message delivered, never before invoke + delay, and stored into
    its topic once (one queue position; re-reads of that position are the consumer's, legal)."""
    sends = _sends(ops)
    positions: dict[str, set[tuple[str, int]]] = defaultdict(set)
    early: set[str] = set()
    worst = 0.0
    for op in _recvs(ops):
        msg_id = op.value["id"]
        s = sends.get(msg_id)
        queue, offset = op.value.get("queue"), op.value.get("offset")
        if isinstance(queue, str) and type(offset) is int:
            positions[msg_id].add((queue, offset))
        if s is None or s.invoke is None or not isinstance(s.value.get("delay_ms"), int):
            continue
        due = s.invoke + s.value["delay_ms"] / 1000
        if op.time < due - tolerance_s:
            early.add(msg_id)
            worst = max(worst, due - op.time)
    promised = {i for i, s in sends.items() if s.outcome == "ok"}
    lost = promised - set(positions) - {op.value["id"] for op in _recvs(ops)}
    twice = {i for i, p in positions.items() if len(p) > 1}
    return LifecycleResult(
        "delay",
        promised=len(promised),
        delivered=len(positions),
        lost=len(lost),
        early=len(early),
        delivered_twice=len(twice),
        worst_early_s=worst,
        samples={"lost": _sample(lost), "early": _sample(early), "delivered_twice": _sample(twice)},
    )


def check_retry(
    ops: Sequence[Op], retry_delays_s: Sequence[float], tolerance_s: float = EARLY_TOLERANCE_S
) -> LifecycleResult:
    """Every acknowledged message consumed successfully in the end (a failed one comes back, it
    is never lost), and the first delivery with reconsume count n + 1 comes no earlier than the
    first failure with count n plus the back-off of retry n (`retry_delays_s[n]`). The first
    failure bounds it soundly: the send-back that produced the retry followed some failure with
    count n, none earlier than the first."""
    sends = _sends(ops)
    first_fail: dict[tuple[str, int], float] = {}
    first_seen: dict[tuple[str, int], float] = {}
    succeeded: set[str] = set()
    seen: set[str] = set()
    retries = 0
    for op in _recvs(ops):
        msg_id, n = op.value["id"], op.value.get("reconsume", 0)
        if not isinstance(n, int):
            continue
        seen.add(msg_id)
        retries += n > 0
        first_seen.setdefault((msg_id, n), op.time)
        if op.value.get("result") == "ok":
            succeeded.add(msg_id)
        else:
            first_fail.setdefault((msg_id, n), op.time)
    early: set[str] = set()
    worst = 0.0
    for (msg_id, n), t in first_seen.items():
        failed_at = first_fail.get((msg_id, n - 1))
        if n == 0 or failed_at is None or n - 1 >= len(retry_delays_s):
            continue
        due = failed_at + retry_delays_s[n - 1]
        if t < due - tolerance_s:
            early.add(msg_id)
            worst = max(worst, due - t)
    promised = {i for i, s in sends.items() if s.outcome == "ok"}
    lost = promised - succeeded
    return LifecycleResult(
        "retry",
        promised=len(promised),
        delivered=len(seen),
        lost=len(lost),
        early=len(early),
        retries=retries,
        worst_early_s=worst,
        samples={"lost": _sample(lost), "early": _sample(early)},
    )


def check_orderly(ops: Sequence[Op]) -> LifecycleResult:
    """One message of a queue in an orderly listener at a time: per queue, sorted by start, each
    call starts after the one before it ended. (Order per key is chaos/checkers.py's check_order
    on the same deliveries; loss is its check_queue.)"""
    by_queue: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for op in _recvs(ops):
        v = op.value
        start, end, queue = v.get("start"), v.get("end"), v.get("queue")
        if (
            isinstance(queue, str)
            and isinstance(start, int | float)
            and isinstance(end, int | float)
        ):
            by_queue[queue].append((float(start), float(end), v["id"]))
    overlapping: set[str] = set()
    for calls in by_queue.values():
        calls.sort()
        busy_until = float("-inf")
        for start, end, msg_id in calls:
            if start < busy_until:
                overlapping.add(msg_id)
            busy_until = max(busy_until, end)
    sends = _sends(ops)
    promised = {i for i, s in sends.items() if s.outcome == "ok"}
    delivered = {op.value["id"] for op in _recvs(ops)}
    lost = promised - delivered
    return LifecycleResult(
        "orderly",
        promised=len(promised),
        delivered=len(delivered),
        lost=len(lost),
        overlap=len(overlapping),
        samples={"lost": _sample(lost), "overlap": _sample(overlapping)},
    )


def check_lifecycle(
    ops: Sequence[Op], mode: str, *, retry_delays_s: Sequence[float] = ()
) -> LifecycleResult | None:
    """The mode's checker, or None for the plain queue workload (chaos/checkers.py covers it)."""
    if mode == "txn":
        return check_txn(ops)
    if mode == "delay":
        return check_delay(ops)
    if mode == "retry":
        return check_retry(ops, retry_delays_s)
    if mode == "orderly":
        return check_orderly(ops)
    if mode in ("queue", "proxy"):  # proxy: the queue checker's ops, through the RocketMQ 5 API
        return None
    raise ValueError(f"unknown workload mode {mode!r}; one of {MODES}")
