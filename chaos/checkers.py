"""The chaos checkers: pure functions from a history (chaos/history.py) to verdicts. They follow
Jepsen's total-queue and OpenChaos's order and recovery checkers, extended with the offsets our
brokers return. Only meaningful after a full drain (every acknowledged message had its chance
to be delivered). No I/O, no clocks: times come from the history."""

from __future__ import annotations

import bisect
import itertools
import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from chaos.history import Op, Window

SAMPLE = 20  # ids listed per violation kind in the JSON (counts are always complete)
E2E_BUCKETS_MS = (1, 5, 10, 100, 1000, 3000)
MERGE_OUTAGES_S = 2.0  # OpenChaos: failures within 2 s after a recovery extend that outage


def _sample(ids: Sequence[str] | set[str]) -> list[str]:
    return sorted(ids)[:SAMPLE]


@dataclass(frozen=True, slots=True)
class Sends:
    """Each send id's invoke and completion (the last one recorded)."""

    invoke: dict[str, Op]
    done: dict[str, Op]

    @classmethod
    def of(cls, ops: Sequence[Op]) -> Sends:
        invoke: dict[str, Op] = {}
        done: dict[str, Op] = {}
        for op in ops:
            if op.f != "send":
                continue
            msg_id = str(op.value.get("id"))
            if op.type == "invoke":
                invoke[msg_id] = op
            else:
                done[msg_id] = op
        return cls(invoke, done)

    def with_type(self, t: str) -> set[str]:
        return {i for i, op in self.done.items() if op.type == t}


def _deliveries(ops: Sequence[Op]) -> list[Op]:
    return [op for op in ops if op.f == "recv" and op.type == "ok"]


# ---- queue ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueueResult:
    """Jepsen total-queue over multisets of ids.
    lost: acknowledged (send ok) and never delivered. unexpected: delivered, never sent.
    duplicated: deliveries beyond the first of an id (copies), and how many ids had copies.
    recovered: delivered although its send's outcome was unknown (info or no completion).
    fail_delivered: delivered although its send definitely failed (a G1a-like violation).
    valid = no lost, no unexpected, no fail_delivered (duplicates are at-least-once: counted)."""

    attempts: int
    acked: int
    failed: int
    unknown: int
    delivered: int
    lost: int
    unexpected: int
    duplicated: int
    duplicated_ids: int
    recovered: int
    fail_delivered: int
    samples: dict[str, list[str]]

    @property
    def valid(self) -> bool:
        return self.lost == 0 and self.unexpected == 0 and self.fail_delivered == 0

    @property
    def duplicate_rate(self) -> float:
        return self.duplicated / self.acked if self.acked else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "valid": self.valid,
            "attempts": self.attempts,
            "acked": self.acked,
            "failed": self.failed,
            "unknown": self.unknown,
            "delivered": self.delivered,
            "lost": self.lost,
            "unexpected": self.unexpected,
            "duplicated": self.duplicated,
            "duplicated_ids": self.duplicated_ids,
            "duplicate_rate": round(self.duplicate_rate, 5),
            "recovered": self.recovered,
            "fail_delivered": self.fail_delivered,
            "samples": self.samples,
        }


def check_queue(ops: Sequence[Op]) -> QueueResult:
    sends = Sends.of(ops)
    attempts = set(sends.invoke)
    acked = sends.with_type("ok")
    failed = sends.with_type("fail")
    unknown = attempts - acked - failed
    counts = Counter(str(op.value.get("id")) for op in _deliveries(ops))
    delivered = set(counts)
    lost = acked - delivered
    unexpected = delivered - attempts - acked
    dups = {i: c - 1 for i, c in counts.items() if c > 1 and i not in unexpected}
    recovered = delivered & unknown
    fail_delivered = delivered & failed
    return QueueResult(
        attempts=len(attempts),
        acked=len(acked),
        failed=len(failed),
        unknown=len(unknown),
        delivered=sum(counts.values()),
        lost=len(lost),
        unexpected=len(unexpected),
        duplicated=sum(dups.values()),
        duplicated_ids=len(dups),
        recovered=len(recovered),
        fail_delivered=len(fail_delivered),
        samples={
            "lost": _sample(lost),
            "unexpected": _sample(unexpected),
            "duplicated": _sample(set(dups)),
            "recovered": _sample(recovered),
            "fail_delivered": _sample(fail_delivered),
        },
    )


# ---- order ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OrderResult:
    """Per sharding key. The required order: one producer's acknowledged sends on a key, each
    invoked after the previous one was acknowledged (sequential); concurrent sends are free.
    Over the first delivery of each id, in delivery order:
    reorder: B's first delivery precedes A's although A is required before B.
    gap: B was delivered but its acknowledged predecessor A never was.
    rewind: a redelivery of an older message after a newer one was delivered (legal under
    at-least-once: reported, not failed).
    inconsistent_offsets: one (queue, offset) reported for two different ids by acks or
    deliveries: the log disagrees with itself.
    valid = no reorder, no gap, no inconsistent offset."""

    keys: int
    pairs: int
    reorder: int
    gap: int
    rewind: int
    inconsistent_offsets: int
    samples: dict[str, list[str]]

    @property
    def valid(self) -> bool:
        return self.reorder == 0 and self.gap == 0 and self.inconsistent_offsets == 0

    def to_json(self) -> dict[str, Any]:
        return {
            "valid": self.valid,
            "keys": self.keys,
            "pairs": self.pairs,
            "reorder": self.reorder,
            "gap": self.gap,
            "rewind": self.rewind,
            "inconsistent_offsets": self.inconsistent_offsets,
            "samples": self.samples,
        }


def required_pairs(ops: Sequence[Op]) -> list[tuple[str, str]]:
    """(A, B): consecutive acknowledged sends of one process on one key, B invoked after A's
    acknowledgement. Consecutive pairs suffice: any inversion of a longer chain shows up as an
    inversion or a gap of some consecutive pair."""
    sends = Sends.of(ops)
    chains: dict[tuple[str, str], list[tuple[float, float, str]]] = defaultdict(list)
    for msg_id, inv in sends.invoke.items():
        key = inv.value.get("key")
        done = sends.done.get(msg_id)
        if key is None or done is None or done.type != "ok":
            continue
        chains[(inv.process, str(key))].append((inv.time, done.time, msg_id))
    pairs = []
    for chain in chains.values():
        chain.sort()
        for (_, a_ok, a), (b_inv, _, b) in itertools.pairwise(chain):
            if a_ok <= b_inv:
                pairs.append((a, b))
    return pairs


def check_order(ops: Sequence[Op]) -> OrderResult:
    deliveries = _deliveries(ops)
    first: dict[str, int] = {}
    for pos, op in enumerate(deliveries):
        first.setdefault(str(op.value.get("id")), pos)
    pairs = required_pairs(ops)
    reorder, gap = [], []
    for a, b in pairs:
        if b not in first:
            continue
        if a not in first:
            gap.append(f"{a}<{b}")
        elif first[b] < first[a]:
            reorder.append(f"{a}<{b}")
    # Rewinds, per key: a delivery of an id first seen before the newest first-seen id of the key.
    newest: dict[str, int] = {}
    rewind = 0
    for pos, op in enumerate(deliveries):
        key = op.value.get("key")
        if key is None:
            continue
        fpos = first[str(op.value.get("id"))]
        if fpos < pos and fpos < newest.get(str(key), -1):
            rewind += 1
        newest[str(key)] = max(newest.get(str(key), -1), fpos)
    # Offsets: acks and deliveries must agree on which id sits at each (queue, offset).
    at: dict[tuple[str, int], str] = {}
    inconsistent: set[str] = set()
    for op in ops:
        if op.type != "ok" or op.f not in ("send", "recv") or "offset" not in op.value:
            continue
        slot = (str(op.value.get("queue")), int(op.value["offset"]))
        msg_id = str(op.value.get("id"))
        seen = at.setdefault(slot, msg_id)
        if seen != msg_id:
            inconsistent.add(f"{slot[0]}@{slot[1]}:{seen}/{msg_id}")
    keys = {str(op.value["key"]) for op in ops if op.f == "send" and op.value.get("key")}
    return OrderResult(
        keys=len(keys),
        pairs=len(pairs),
        reorder=len(reorder),
        gap=len(gap),
        rewind=rewind,
        inconsistent_offsets=len(inconsistent),
        samples={
            "reorder": reorder[:SAMPLE],
            "gap": gap[:SAMPLE],
            "inconsistent_offsets": _sample(inconsistent),
        },
    )


# ---- availability --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WindowResult:
    """One fault window (times in seconds).
    longest_gap_s: the longest stretch from the fault's start to its heal without a send
    acknowledgement (the start and the heal count as ends of stretches), i.e. how long the
    service was gone at worst while the fault lasted.
    first_ack_s: from the start to the first acknowledgement of a send invoked after it.
    rto_s (OpenChaos): from the invoke of the first send invoked inside the window that did
    not succeed (fail/info) to the next acknowledgement; None when every such send succeeded
    (our producer retries inside one send, so most faults show as slow sends, not failures).
    recovered_in_fault: service was back before the heal (a failover, not a repair)."""

    fault: str
    targets: tuple[str, ...]
    start: float
    stop: float | None
    longest_gap_s: float
    first_ack_s: float | None
    rto_s: float | None
    recovered_in_fault: bool

    def to_json(self) -> dict[str, Any]:
        r = 3
        return {
            "fault": self.fault,
            "targets": list(self.targets),
            "start": round(self.start, r),
            "length_s": None if self.stop is None else round(self.stop - self.start, r),
            "longest_gap_s": round(self.longest_gap_s, r),
            "first_ack_s": None if self.first_ack_s is None else round(self.first_ack_s, r),
            "rto_s": None if self.rto_s is None else round(self.rto_s, r),
            "recovered_in_fault": self.recovered_in_fault,
        }


def check_windows(ops: Sequence[Op], windows: Sequence[Window]) -> list[WindowResult]:
    sends = Sends.of(ops)
    oks = sorted(op.time for op in sends.done.values() if op.type == "ok")
    ok_after_invoke = sorted(
        (sends.done[i].time, inv.time)
        for i, inv in sends.invoke.items()
        if i in sends.done and sends.done[i].type == "ok"
    )
    bad_invokes = sorted(
        inv.time
        for i, inv in sends.invoke.items()
        if i not in sends.done or sends.done[i].type != "ok"
    )
    end_of_history = ops[-1].time if ops else 0.0
    out = []
    for w in windows:
        stop = w.stop if w.stop is not None else end_of_history
        lo, hi = bisect.bisect_right(oks, w.start), bisect.bisect_right(oks, stop)
        points = [w.start, *oks[lo:hi], stop]
        gap = max((b - a for a, b in itertools.pairwise(points)), default=0.0)
        first = next((t - w.start for t, inv in ok_after_invoke if inv >= w.start), None)
        k = bisect.bisect_left(bad_invokes, w.start)
        rto = None
        recovered = True
        if k < len(bad_invokes) and bad_invokes[k] <= stop:
            j = bisect.bisect_right(oks, bad_invokes[k])
            if j < len(oks):
                rto = oks[j] - bad_invokes[k]
                recovered = oks[j] <= stop
            else:
                recovered = False
        else:
            recovered = first is not None and w.start + first <= stop
        out.append(WindowResult(w.fault, w.targets, w.start, w.stop, gap, first, rto, recovered))
    return out


def unavailability(ops: Sequence[Op]) -> list[tuple[float, float]]:
    """Whole-run outages: a fail/info completion opens one at its send's invoke, the next ok
    completion closes it; failures within MERGE_OUTAGES_S of the previous recovery extend it."""
    sends = Sends.of(ops)
    events = sorted(
        (op.time, op.type, sends.invoke[i].time if i in sends.invoke else op.time)
        for i, op in sends.done.items()
    )
    out: list[tuple[float, float]] = []
    opened: float | None = None
    for t, kind, invoked in events:
        if kind == "ok":
            if opened is not None:
                out.append((opened, t))
                opened = None
        elif opened is None:
            opened = out.pop()[0] if out and invoked - out[-1][1] <= MERGE_OUTAGES_S else invoked
    return out


# ---- latency -------------------------------------------------------------------------------------


def _pct(xs: list[float], p: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, math.ceil(p / 100 * len(xs)) - 1))]


def _stats_ms(xs: list[float]) -> dict[str, Any]:
    def ms(v: float | None) -> float | None:
        return None if v is None else round(v * 1000, 2)

    return {
        "count": len(xs),
        "p50_ms": ms(_pct(xs, 50)),
        "p99_ms": ms(_pct(xs, 99)),
        "max_ms": ms(max(xs) if xs else None),
    }


def check_latency(ops: Sequence[Op], windows: Sequence[Window]) -> dict[str, Any]:
    """Send latency (ok - invoke) inside fault windows and outside them (by invoke time), and
    end-to-end latency (first delivery - invoke) in OpenChaos's buckets."""
    sends = Sends.of(ops)
    end = ops[-1].time if ops else 0.0
    spans = [(w.start, w.stop if w.stop is not None else end) for w in windows]
    inside: list[float] = []
    outside: list[float] = []
    for i, inv in sends.invoke.items():
        done = sends.done.get(i)
        if done is None or done.type != "ok":
            continue
        lat = done.time - inv.time
        (inside if any(a <= inv.time <= b for a, b in spans) else outside).append(lat)
    first_seen: dict[str, float] = {}
    for op in _deliveries(ops):
        first_seen.setdefault(str(op.value.get("id")), op.time)
    buckets: Counter[str] = Counter()
    for i, t in first_seen.items():
        if i not in sends.invoke:
            continue
        ms = (t - sends.invoke[i].time) * 1000
        label = next((f"<={b}ms" for b in E2E_BUCKETS_MS if ms <= b), f">{E2E_BUCKETS_MS[-1]}ms")
        buckets[label] += 1
    order = [f"<={b}ms" for b in E2E_BUCKETS_MS] + [f">{E2E_BUCKETS_MS[-1]}ms"]
    return {
        "send_in_fault": _stats_ms(inside),
        "send_outside_fault": _stats_ms(outside),
        "end_to_end": {k: buckets.get(k, 0) for k in order},
    }


# ---- all -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CheckReport:
    scenario: str
    seed: int
    queue: QueueResult
    order: OrderResult
    windows: list[WindowResult]
    outages: list[tuple[float, float]]
    latency: dict[str, Any] = field(default_factory=dict)

    @property
    def valid(self) -> bool:
        return self.queue.valid and self.order.valid

    @property
    def worst_gap_s(self) -> float | None:
        return max((w.longest_gap_s for w in self.windows), default=None)

    def verdict(self) -> str:
        q, o = self.queue, self.order
        gap = "none" if self.worst_gap_s is None else f"{self.worst_gap_s:.2f} s"
        return (
            f"{'PASS' if self.valid else 'FAIL'} {self.scenario} seed={self.seed}: "
            f"{q.acked} acked, {q.lost} lost, {q.unexpected} unexpected, "
            f"{q.fail_delivered} failed-but-delivered, {q.duplicated} dup, {o.reorder} reorder, "
            f"{o.gap} gap, worst gap in a fault {gap}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "seed": self.seed,
            "valid": self.valid,
            "verdict": self.verdict(),
            "queue": self.queue.to_json(),
            "order": self.order.to_json(),
            "windows": [w.to_json() for w in self.windows],
            "outages": [[round(a, 3), round(b, 3)] for a, b in self.outages],
            "latency": self.latency,
        }


def check_all(
    ops: Sequence[Op], windows: Sequence[Window], *, scenario: str, seed: int
) -> CheckReport:
    return CheckReport(
        scenario,
        seed,
        check_queue(ops),
        check_order(ops),
        check_windows(ops, windows),
        unavailability(ops),
        check_latency(ops, windows),
    )
