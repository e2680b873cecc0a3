"""The chaos checkers: pure functions from a history (chaos/history.py) to verdicts, after
Jepsen's total-queue and Kafka checks and OpenChaos's order, RTO and latency checkers. No I/O
and no clock: every time comes from the history. Queue and order verdicts only mean something
after a full drain (every acknowledged message had its chance to be delivered)."""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from raftmq.chaos.history import Op, OpType, Window, fault_windows

SAMPLE = 20  # ids listed per violation kind in the JSON; the counts are always complete
E2E_BUCKETS_MS = (1, 5, 10, 100, 1000, 3000)  # OpenChaos EndToEndLatencyChecker
MERGE_OUTAGES_S = 2.0  # OpenChaos: failures within 2 s after a recovery belong to that outage
GAP_BEFORE_S = 1.0  # max_ok_gap_s looks this far before a fault's start ...
GAP_AFTER_S = 5.0  # ... and this far after its stop


# ---- one pass over the history ------------------------------------------------------------------


@dataclass(slots=True)
class _Send:
    """What the history says about one message id's send: its first invoke and first
    completion (a well-formed history has exactly one of each)."""

    process: str | None = None
    key: str | None = None
    invoke: float | None = None
    outcome: OpType | None = None
    done: float | None = None


@dataclass(slots=True)
class _Index:
    sends: dict[str, _Send]
    deliveries: list[Op]  # recv ok ops in delivery order
    first_pos: dict[str, int]  # id -> position of its first delivery in `deliveries`
    slots: list[tuple[str, int, str]]  # (queue, offset, id) from send ok and recv values
    send_times: tuple[float, float] | None  # first and last time of any send op
    end: float  # time of the last op (0.0 for an empty history)
    anomalies: Counter[str]


def _key_of(value: dict[str, Any]) -> str | None:
    key = value.get("key")
    return None if key is None else str(key)


def _offset_of(value: dict[str, Any]) -> int | None:
    offset = value.get("offset")
    return offset if isinstance(offset, int) and not isinstance(offset, bool) else None


def _delivery_order(op: Op) -> tuple[float, int]:
    offset = _offset_of(op.value)
    return op.time, -1 if offset is None else offset


def _index(ops: Sequence[Op]) -> _Index:
    ordered = sorted(ops, key=lambda op: op.time)  # stable; O(n) on an already merged history
    sends: dict[str, _Send] = {}
    deliveries: list[Op] = []
    slots: list[tuple[str, int, str]] = []
    anomalies: Counter[str] = Counter()
    first_send = last_send = None
    for op in ordered:
        if op.f in ("nemesis", "event"):  # events: lifecycle notes, chaos/lifecycle_checks.py
            continue
        value = op.value
        msg_id = value.get("id")
        if msg_id is None:
            anomalies["without_id"] += 1  # nothing to match it with
            continue
        offset = value.get("offset")
        if type(offset) is not int:  # bool is an int subclass, and never an offset
            offset = None
        queue = value.get("queue")
        if op.f == "recv":
            if op.type != "ok":
                anomalies["recv_not_ok"] += 1  # deliveries are ok ops by convention; ignored
                continue
            deliveries.append(op)
            if isinstance(queue, str) and offset is not None:
                slots.append((queue, offset, msg_id))
            continue
        if first_send is None:
            first_send = op.time
        last_send = op.time
        s = sends.setdefault(msg_id, _Send())
        if op.type == "invoke":
            if s.invoke is not None:
                anomalies["invoked_twice"] += 1  # ids must be unique per message
                continue
            s.process, s.key, s.invoke = op.process, _key_of(op.value), op.time
        elif s.outcome is not None:
            anomalies["completed_twice"] += 1
        else:
            if s.invoke is None:
                anomalies["completed_without_invoke"] += 1
                s.process, s.key = op.process, _key_of(op.value)
            s.outcome, s.done = op.type, op.time
            if op.type == "ok" and isinstance(queue, str) and offset is not None:
                slots.append((queue, offset, msg_id))
    # Times tie between a consumer's polls more often than one would think (coarse clocks on
    # some machines): within one instant the queue offset decides.
    deliveries.sort(key=_delivery_order)
    first_pos: dict[str, int] = {}
    for pos, op in enumerate(deliveries):
        first_pos.setdefault(op.value["id"], pos)
    send_times = None if first_send is None or last_send is None else (first_send, last_send)
    end = ordered[-1].time if ordered else 0.0
    return _Index(sends, deliveries, first_pos, slots, send_times, end, anomalies)


def _sample(ids: Iterable[str]) -> list[str]:
    return heapq.nsmallest(SAMPLE, ids)


def _windows(ops: Sequence[Op], windows: Sequence[Window] | None) -> list[Window]:
    return fault_windows(ops) if windows is None else list(windows)


# ---- queue (Jepsen total-queue) -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueueResult:
    """Jepsen's total-queue over message ids, with multiplicity for deliveries.

    attempts: distinct ids with a send invoke. acked: ids whose send completed ok. failed: ids
    whose send completed fail (definitely not stored). unknown: attempts neither acked nor
    failed (completed info, or no completion). delivered: recv ok ops (every copy);
    delivered_ids: distinct ids among them.
    lost: acked ids never delivered. unexpected: delivered ids with no send op at all.
    duplicated: deliveries beyond the first of a sent id (extra copies); duplicated_ids: sent
    ids delivered more than once. duplicate_rate = duplicated / acked (0 when nothing acked).
    recovered: delivered ids whose send outcome was unknown (fine: the send did happen).
    fail_delivered: delivered ids whose send definitely failed (a G1a-like violation: the
    client was told "not stored").
    at_least_once = lost == 0; at_most_once = duplicated == 0 and fail_delivered == 0
    (OpenChaos's flags).
    valid = lost == 0 and unexpected == 0 and fail_delivered == 0; duplicates are legal under
    at-least-once and only counted.
    anomalies: malformed-history counts (an id invoked twice, completed twice, completed
    without an invoke, a recv that is not ok, a send or recv without an id; such ops are
    otherwise ignored); a well-formed history has none.
    """

    attempts: int
    acked: int
    failed: int
    unknown: int
    delivered: int
    delivered_ids: int
    lost: int
    unexpected: int
    duplicated: int
    duplicated_ids: int
    recovered: int
    fail_delivered: int
    samples: dict[str, list[str]]
    anomalies: dict[str, int] = field(default_factory=dict)

    @property
    def valid(self) -> bool:
        return self.lost == 0 and self.unexpected == 0 and self.fail_delivered == 0

    @property
    def duplicate_rate(self) -> float:
        return self.duplicated / self.acked if self.acked else 0.0

    @property
    def at_least_once(self) -> bool:
        return self.lost == 0

    @property
    def at_most_once(self) -> bool:
        return self.duplicated == 0 and self.fail_delivered == 0

    def to_json(self) -> dict[str, Any]:
        return {
            "valid": self.valid,
            "attempts": self.attempts,
            "acked": self.acked,
            "failed": self.failed,
            "unknown": self.unknown,
            "delivered": self.delivered,
            "delivered_ids": self.delivered_ids,
            "lost": self.lost,
            "unexpected": self.unexpected,
            "duplicated": self.duplicated,
            "duplicated_ids": self.duplicated_ids,
            "duplicate_rate": round(self.duplicate_rate, 6),
            "recovered": self.recovered,
            "fail_delivered": self.fail_delivered,
            "at_least_once": self.at_least_once,
            "at_most_once": self.at_most_once,
            "exactly_once": self.at_least_once and self.at_most_once,
            "samples": self.samples,
            "anomalies": self.anomalies,
        }


def check_queue(ops: Sequence[Op]) -> QueueResult:
    """Lost, unexpected, duplicated, recovered and failed-but-delivered messages; see
    QueueResult for the definitions."""
    return _check_queue(_index(ops))


def _check_queue(ix: _Index) -> QueueResult:
    attempts = {i for i, s in ix.sends.items() if s.invoke is not None}
    acked = {i for i, s in ix.sends.items() if s.outcome == "ok"}
    failed = {i for i, s in ix.sends.items() if s.outcome == "fail"}
    unknown = attempts - acked - failed
    copies = Counter(op.value["id"] for op in ix.deliveries)
    delivered = set(copies)
    lost = acked - delivered
    unexpected = delivered - ix.sends.keys()
    dups = {i: n - 1 for i, n in copies.items() if n > 1 and i in ix.sends}
    recovered = delivered & unknown
    fail_delivered = delivered & failed
    return QueueResult(
        attempts=len(attempts),
        acked=len(acked),
        failed=len(failed),
        unknown=len(unknown),
        delivered=len(ix.deliveries),
        delivered_ids=len(delivered),
        lost=len(lost),
        unexpected=len(unexpected),
        duplicated=sum(dups.values()),
        duplicated_ids=len(dups),
        recovered=len(recovered),
        fail_delivered=len(fail_delivered),
        samples={
            "lost": _sample(lost),
            "unexpected": _sample(unexpected),
            "duplicated": _sample(dups),
            "recovered": _sample(recovered),
            "fail_delivered": _sample(fail_delivered),
        },
        anomalies=dict(sorted(ix.anomalies.items())),
    )


# ---- order --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OrderResult:
    """Per sharding key, over the first delivery of each id (deliveries sorted by time, then
    queue offset).

    Required order: A must precede B when both are acked sends of the same producer process
    with the same key (not None) and A's ok completion came before B's invoke (sequential
    sends). Concurrent sends on a key, and sends of different processes, are unconstrained.
    keys: distinct keys of acked keyed sends; ordered_sends: acked keyed sends; constrained:
    those with at least one required predecessor.
    reorder: delivered messages B first delivered before the first delivery of some required
    predecessor A (each early B counts once, however many predecessors it overtook).
    gap: acked messages A never delivered although some message B that must follow A was
    delivered (each missing A counts once; A is also `lost` for the queue checker).
    rewind: redeliveries (not the first delivery of their id) that come after the first
    delivery of a newer message of the same key, i.e. the consumer went back. Legal under
    at-least-once: reported, never failed.
    inconsistent_offsets: (queue, offset) slots reported, by a send ok or a delivery, for two
    or more different ids: the log disagrees with itself.
    multi_offset_ids: ids found at two or more (queue, offset) slots: stored twice (a duplicate,
    legal under at-least-once: reported, never failed).
    valid = reorder == 0 and gap == 0 and inconsistent_offsets == 0.
    """

    keys: int
    ordered_sends: int
    constrained: int
    reorder: int
    gap: int
    rewind: int
    inconsistent_offsets: int
    multi_offset_ids: int
    samples: dict[str, list[str]]

    @property
    def valid(self) -> bool:
        return self.reorder == 0 and self.gap == 0 and self.inconsistent_offsets == 0

    def to_json(self) -> dict[str, Any]:
        return {
            "valid": self.valid,
            "keys": self.keys,
            "ordered_sends": self.ordered_sends,
            "constrained": self.constrained,
            "reorder": self.reorder,
            "gap": self.gap,
            "rewind": self.rewind,
            "inconsistent_offsets": self.inconsistent_offsets,
            "multi_offset_ids": self.multi_offset_ids,
            "samples": self.samples,
        }


def check_order(ops: Sequence[Op]) -> OrderResult:
    """Reorders, gaps and rewinds per key, and offset consistency per queue; see OrderResult."""
    return _check_order(_index(ops))


def _check_order(ix: _Index) -> OrderResult:
    # Chains: one producer's acked sends on one key, as (ok time, invoke time, id).
    chains: dict[tuple[str, str], list[tuple[float, float, str]]] = defaultdict(list)
    for msg_id, s in ix.sends.items():
        if s.key is None or s.outcome != "ok" or s.done is None or s.process is None:
            continue
        invoke = s.done if s.invoke is None else s.invoke
        chains[(s.process, s.key)].append((s.done, invoke, msg_id))
    never = len(ix.deliveries)  # position of an undelivered message: after every delivery
    constrained = 0
    reorder: list[str] = []
    gap: list[str] = []
    for chain in chains.values():
        # "A precedes B" iff ok(A) < invoke(B): B's required predecessors are a prefix of the
        # chain sorted by ok time, so prefix maxima answer each B in O(log n).
        chain.sort()
        ok_times = [ok for ok, _, _ in chain]
        latest_pos = -1  # the latest first delivery among the prefix's delivered messages
        latest_id = ""
        prefix: list[tuple[int, str]] = [(-1, "")]
        for _, _, msg_id in chain:
            pos = ix.first_pos.get(msg_id, -1)
            if pos > latest_pos:
                latest_pos, latest_id = pos, msg_id
            prefix.append((latest_pos, latest_id))
        last_delivered_invoke = -math.inf
        last_delivered_id = ""
        for _, invoke, msg_id in chain:
            k = bisect.bisect_left(ok_times, invoke)
            constrained += k > 0
            pos = ix.first_pos.get(msg_id, never)
            if pos == never:
                continue
            if invoke > last_delivered_invoke:
                last_delivered_invoke, last_delivered_id = invoke, msg_id
            before_pos, before_id = prefix[k]
            if before_pos > pos:
                reorder.append(f"{msg_id} before {before_id}")
        for ok, _, msg_id in chain:
            if msg_id not in ix.first_pos and ok < last_delivered_invoke:
                gap.append(f"{msg_id} missing before {last_delivered_id}")
    # Rewinds: per key, a redelivery of a message first delivered before the newest message
    # delivered so far on that key.
    newest: dict[str, int] = {}
    rewind: list[str] = []
    for pos, op in enumerate(ix.deliveries):
        msg_id = op.value["id"]
        send = ix.sends.get(msg_id)
        key = send.key if send is not None and send.invoke is not None else _key_of(op.value)
        if key is None:
            continue
        first = ix.first_pos[msg_id]
        newest_first = newest.get(key, -1)
        if first < pos and first < newest_first:
            rewind.append(msg_id)
        elif first > newest_first:
            newest[key] = first
    # Offsets: acks and deliveries must agree on which id sits at each (queue, offset). Sets are
    # only built for the rare conflicts: a healthy history has one id per slot and vice versa.
    first_at: dict[tuple[str, int], str] = {}
    first_slot: dict[str, tuple[str, int]] = {}
    clashes: dict[tuple[str, int], set[str]] = {}
    multi: set[str] = set()
    for queue, offset, msg_id in ix.slots:
        slot = (queue, offset)
        holder = first_at.setdefault(slot, msg_id)
        if holder != msg_id:
            clashes.setdefault(slot, {holder}).add(msg_id)
        if first_slot.setdefault(msg_id, slot) != slot:
            multi.add(msg_id)
    inconsistent = sorted(f"{q}@{o}: {', '.join(sorted(ids))}" for (q, o), ids in clashes.items())
    ordered_sends = sum(len(c) for c in chains.values())
    return OrderResult(
        keys=len({key for _, key in chains}),
        ordered_sends=ordered_sends,
        constrained=constrained,
        reorder=len(reorder),
        gap=len(gap),
        rewind=len(rewind),
        inconsistent_offsets=len(inconsistent),
        multi_offset_ids=len(multi),
        samples={
            "reorder": reorder[:SAMPLE],
            "gap": gap[:SAMPLE],
            "rewind": rewind[:SAMPLE],
            "inconsistent_offsets": inconsistent[:SAMPLE],
            "multi_offset_ids": _sample(multi),
        },
    )


# ---- availability -------------------------------------------------------------------------------


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


@dataclass(frozen=True, slots=True)
class WindowResult:
    """One fault window, start s and stop e (for a window never healed, e is the time of the
    last send op). Times in seconds of the history's clock; durations in seconds. "Failed" means
    a send completed fail or info; sends without a completion are ignored here (a complete
    history has none). "Ack" means a send ok completion.

    failed_sends: sends invoked in [s, e] that failed.
    rto_s (OpenChaos RTO): F = the failed send invoked first in [s, e]; from F's invoke to the
    first ack after F's completion. None when no send invoked in the window failed, or when
    no ack ever followed F.
    recovered_in_fault: that ack came no later than the stop (a failover, not a repair); True
    for a window never healed once the ack exists; None when no send failed in the window.
    after_heal_s: when failures did not end inside the fault: from the stop to the first ack at
    or after it; None otherwise (or with no such ack).
    service_return_s: L = the failed send invoked in [s, e] that completed last; from s to the
    first ack after L's completion; None when no send failed in the window or no ack followed.
    first_ack_s: from s to the earliest ack of a send invoked at or after s (how soon a fresh
    send succeeded; our producer retries inside one send, so a fault often shows as slow
    sends, not failures); None when there is none.
    longest_gap_s: the longest stretch of [s, e] without an ack, s and e counting as the ends of
    the first and last stretch: the worst service gap during the fault.
    max_ok_gap_s (Jepsen's view): the same over [max(s - 1 s, first send op),
    min(e + 5 s, last send op)], i.e. around the fault (0 when that range is empty).
    served_after_heal: an ack came after the stop; None when the window was never healed or no
    send was invoked after the stop (nothing to judge by); False fails the run.
    """

    fault: str
    targets: tuple[str, ...]
    start: float
    stop: float | None
    failed_sends: int
    rto_s: float | None
    recovered_in_fault: bool | None
    after_heal_s: float | None
    service_return_s: float | None
    first_ack_s: float | None
    longest_gap_s: float
    max_ok_gap_s: float
    served_after_heal: bool | None

    def to_json(self) -> dict[str, Any]:
        return {
            "fault": self.fault,
            "targets": list(self.targets),
            "start": round(self.start, 3),
            "stop": _r(self.stop),
            "length_s": None if self.stop is None else round(self.stop - self.start, 3),
            "failed_sends": self.failed_sends,
            "rto_s": _r(self.rto_s),
            "recovered_in_fault": self.recovered_in_fault,
            "after_heal_s": _r(self.after_heal_s),
            "service_return_s": _r(self.service_return_s),
            "first_ack_s": _r(self.first_ack_s),
            "longest_gap_s": round(self.longest_gap_s, 3),
            "max_ok_gap_s": round(self.max_ok_gap_s, 3),
            "served_after_heal": self.served_after_heal,
        }


@dataclass(frozen=True, slots=True)
class Outage:
    """A whole-run unavailability window: opened at the invoke of a failed send (completed fail
    or info) while no outage is open, closed by the next ack (send ok completion) after that
    failure's completion; stop None if no ack followed. A failure invoked at most
    MERGE_OUTAGES_S (2 s) after the previous outage closed, or before it closed, reopens that
    outage instead of starting a new one (OpenChaos ignores such failures)."""

    start: float
    stop: float | None

    @property
    def length_s(self) -> float | None:
        return None if self.stop is None else self.stop - self.start

    def to_json(self) -> dict[str, Any]:
        return {"start": round(self.start, 3), "stop": _r(self.stop), "length_s": _r(self.length_s)}


@dataclass(frozen=True, slots=True)
class AvailabilityResult:
    """Per fault window figures (WindowResult) and whole-run outages (Outage).
    never_recovered: healed windows with served_after_heal False (sends kept coming after the
    heal and none was acknowledged).
    valid = never_recovered == 0. How fast service must come back is the runner's bound, not a
    checker verdict."""

    windows: tuple[WindowResult, ...]
    outages: tuple[Outage, ...]

    @property
    def never_recovered(self) -> int:
        return sum(w.served_after_heal is False for w in self.windows)

    @property
    def valid(self) -> bool:
        return self.never_recovered == 0

    def worst_rto(self) -> WindowResult | None:
        """The window with the longest rto_s (None when no window has one)."""
        with_rto = [w for w in self.windows if w.rto_s is not None]
        return max(with_rto, key=lambda w: w.rto_s or 0.0, default=None)

    def to_json(self) -> dict[str, Any]:
        return {
            "valid": self.valid,
            "never_recovered": self.never_recovered,
            "windows": [w.to_json() for w in self.windows],
            "outages": [o.to_json() for o in self.outages],
            "unavailable_s": round(sum(o.length_s or 0.0 for o in self.outages), 3),
        }


def check_availability(
    ops: Sequence[Op], windows: Sequence[Window] | None = None
) -> AvailabilityResult:
    """Per window RTO and service gaps, and whole-run outages; windows default to the history's
    own nemesis ops. See WindowResult and Outage for the definitions."""
    return _check_availability(_index(ops), _windows(ops, windows))


def _longest_gap(acks: list[float], lo: float, hi: float) -> float:
    if hi <= lo:
        return 0.0
    inside = acks[bisect.bisect_right(acks, lo) : bisect.bisect_left(acks, hi)]
    points = [lo, *inside, hi]
    return max(b - a for a, b in itertools.pairwise(points))


def _first_after(acks: list[float], t: float, *, inclusive: bool = False) -> float | None:
    i = (bisect.bisect_left if inclusive else bisect.bisect_right)(acks, t)
    return acks[i] if i < len(acks) else None


def _check_availability(ix: _Index, windows: Sequence[Window]) -> AvailabilityResult:
    acks = sorted(s.done for s in ix.sends.values() if s.outcome == "ok" and s.done is not None)
    # Failed sends as (invoke, completion), by invoke time; an invoke-less one counts from its
    # completion.
    failures = sorted(
        (s.done if s.invoke is None else s.invoke, s.done)
        for s in ix.sends.values()
        if s.outcome in ("fail", "info") and s.done is not None
    )
    fail_invokes = [inv for inv, _ in failures]
    # Acks by invoke time, with the suffix minimum of their ack times: the earliest ack of a
    # send invoked at or after any instant.
    acked = sorted(
        (s.invoke, s.done)
        for s in ix.sends.values()
        if s.outcome == "ok" and s.done is not None and s.invoke is not None
    )
    acked_invokes = [inv for inv, _ in acked]
    suffix_min = [math.inf] * (len(acked) + 1)
    for i in range(len(acked) - 1, -1, -1):
        suffix_min[i] = min(acked[i][1], suffix_min[i + 1])
    invokes = sorted(s.invoke for s in ix.sends.values() if s.invoke is not None)
    first_send, last_send = ix.send_times or (0.0, 0.0)

    results = []
    for w in windows:
        s = w.start
        e = max(s, w.end(last_send))
        lo, hi = bisect.bisect_left(fail_invokes, s), bisect.bisect_right(fail_invokes, e)
        inside = failures[lo:hi]
        rto: float | None = None
        recovered: bool | None = None
        after_heal: float | None = None
        service_return: float | None = None
        if inside:
            f_invoke, f_done = inside[0]
            back = _first_after(acks, f_done)
            if back is not None:
                rto = back - f_invoke
                recovered = w.stop is None or back <= w.stop
            else:
                recovered = False
            if not recovered and w.stop is not None:
                heal_ack = _first_after(acks, w.stop, inclusive=True)
                after_heal = None if heal_ack is None else heal_ack - w.stop
            last_done = max(done for _, done in inside)
            returned = _first_after(acks, last_done)
            service_return = None if returned is None else returned - s
        j = bisect.bisect_left(acked_invokes, s)
        first_ack = None if math.isinf(suffix_min[j]) else suffix_min[j] - s
        served: bool | None = None
        if w.stop is not None and bisect.bisect_right(invokes, w.stop) < len(invokes):
            served = _first_after(acks, w.stop) is not None
        around_lo = max(s - GAP_BEFORE_S, first_send)
        around_hi = min(w.end(last_send) + GAP_AFTER_S, last_send)
        results.append(
            WindowResult(
                fault=w.fault,
                targets=w.targets,
                start=s,
                stop=w.stop,
                failed_sends=len(inside),
                rto_s=rto,
                recovered_in_fault=recovered,
                after_heal_s=after_heal,
                service_return_s=service_return,
                first_ack_s=first_ack,
                longest_gap_s=_longest_gap(acks, s, e),
                max_ok_gap_s=_longest_gap(acks, around_lo, around_hi),
                served_after_heal=served,
            )
        )
    return AvailabilityResult(tuple(results), tuple(_outages(ix)))


def unavailability(ops: Sequence[Op]) -> list[Outage]:
    """Whole-run outages; see Outage for the definition."""
    return _outages(_index(ops))


def _outages(ix: _Index) -> list[Outage]:
    # Completions in completion order; ties keep dict (i.e. first-op) order, which is the
    # history's order.
    events = sorted(
        (
            (s.done, s.outcome == "ok", s.done if s.invoke is None else s.invoke)
            for s in ix.sends.values()
            if s.outcome is not None and s.done is not None
        ),
        key=lambda e: e[0],
    )
    out: list[Outage] = []
    opened: float | None = None
    for done, ok, invoke in events:
        if ok:
            if opened is not None:
                out.append(Outage(opened, done))
                opened = None
        elif opened is None:
            prev = out[-1] if out else None
            if prev is not None and prev.stop is not None and invoke - prev.stop <= MERGE_OUTAGES_S:
                out.pop()
                opened = min(prev.start, invoke)
            else:
                opened = invoke
        else:
            opened = min(opened, invoke)  # a slower failure may have been invoked earlier
    if opened is not None:
        out.append(Outage(opened, None))
    return out


# ---- latency ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LatencyStats:
    """count, and nearest-rank percentiles (the p-th is the ceil(p/100 * count)-th smallest)
    and maximum, in seconds; None when count is 0."""

    count: int
    p50_s: float | None
    p99_s: float | None
    max_s: float | None

    @classmethod
    def of(cls, xs: list[float]) -> LatencyStats:
        if not xs:
            return cls(0, None, None, None)
        xs = sorted(xs)

        def rank(p: float) -> float:
            return xs[max(0, math.ceil(p / 100 * len(xs)) - 1)]

        return cls(len(xs), rank(50), rank(99), xs[-1])

    def to_json(self) -> dict[str, Any]:
        def ms(x: float | None) -> float | None:
            return None if x is None else round(x * 1000, 2)

        return {
            "count": self.count,
            "p50_ms": ms(self.p50_s),
            "p99_ms": ms(self.p99_s),
            "max_ms": ms(self.max_s),
        }


def _bucket_names() -> list[str]:
    return [f"<={b}ms" for b in E2E_BUCKETS_MS] + [f">{E2E_BUCKETS_MS[-1]}ms"]


@dataclass(frozen=True, slots=True)
class LatencyResult:
    """send_in_fault / send_outside_fault: ok completion - invoke of acked sends, split by
    whether the invoke lies in some fault window [start, stop] (a window never healed lasts to
    the end of the history).
    end_to_end: first delivery - send invoke, for delivered ids that have an invoke; and the
    same counted in OpenChaos's buckets: <=1, <=5, <=10, <=100, <=1000, <=3000 ms and >3000 ms
    (each latency in the first bucket it fits).
    valid is always True: latency is reported, never failed."""

    send_in_fault: LatencyStats
    send_outside_fault: LatencyStats
    end_to_end: LatencyStats
    end_to_end_buckets: dict[str, int]

    @property
    def valid(self) -> bool:
        return True

    def to_json(self) -> dict[str, Any]:
        return {
            "send_in_fault": self.send_in_fault.to_json(),
            "send_outside_fault": self.send_outside_fault.to_json(),
            "end_to_end": self.end_to_end.to_json(),
            "end_to_end_buckets": self.end_to_end_buckets,
        }


def check_latency(ops: Sequence[Op], windows: Sequence[Window] | None = None) -> LatencyResult:
    """Send latency inside and outside fault windows and end-to-end latency; see LatencyResult.
    Windows default to the history's own nemesis ops."""
    return _check_latency(_index(ops), _windows(ops, windows))


def _check_latency(ix: _Index, windows: Sequence[Window]) -> LatencyResult:
    # Overlapping windows merged into disjoint spans, so one bisect places an invoke.
    spans: list[tuple[float, float]] = []
    for w in sorted(windows, key=lambda w: w.start):
        stop = w.end(ix.end)
        if spans and w.start <= spans[-1][1]:
            spans[-1] = (spans[-1][0], max(spans[-1][1], stop))
        else:
            spans.append((w.start, stop))
    starts = [a for a, _ in spans]

    def in_fault(t: float) -> bool:
        i = bisect.bisect_right(starts, t) - 1
        return i >= 0 and t <= spans[i][1]

    inside: list[float] = []
    outside: list[float] = []
    for s in ix.sends.values():
        if s.outcome == "ok" and s.invoke is not None and s.done is not None:
            (inside if in_fault(s.invoke) else outside).append(s.done - s.invoke)
    e2e: list[float] = []
    buckets = dict.fromkeys(_bucket_names(), 0)
    names = _bucket_names()
    for msg_id, pos in ix.first_pos.items():
        send = ix.sends.get(msg_id)
        if send is None or send.invoke is None:
            continue
        latency = ix.deliveries[pos].time - send.invoke
        e2e.append(latency)
        buckets[names[bisect.bisect_left(E2E_BUCKETS_MS, latency * 1000)]] += 1
    return LatencyResult(
        LatencyStats.of(inside), LatencyStats.of(outside), LatencyStats.of(e2e), buckets
    )


# ---- everything ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CheckReport:
    """Every checker's result for one run.
    valid = queue valid and availability valid and, when the topic is ordered, order valid;
    for an unordered run only the order checker's inconsistent_offsets still counts (offsets
    must agree whatever the ordering)."""

    scenario: str
    seed: int | None
    ordered: bool
    queue: QueueResult
    order: OrderResult
    availability: AvailabilityResult
    latency: LatencyResult

    @property
    def valid(self) -> bool:
        order_ok = self.order.valid if self.ordered else self.order.inconsistent_offsets == 0
        return self.queue.valid and order_ok and self.availability.valid

    @property
    def windows(self) -> tuple[WindowResult, ...]:
        return self.availability.windows

    @property
    def outages(self) -> tuple[Outage, ...]:
        return self.availability.outages

    def verdict(self) -> str:
        """One line, e.g. `PASS leader-kill seed=7: 4210 acked, 0 lost, 0 unexpected, 3 dup,
        0 reorder, worst rto 1.21 s (in fault)`; counts that are zero in a healthy run and
        need not be shown (failed-but-delivered, gap, inconsistent offsets, never recovered)
        appear only when non-zero."""
        q, o, a = self.queue, self.order, self.availability
        parts = [f"{q.acked} acked", f"{q.lost} lost", f"{q.unexpected} unexpected"]
        if q.fail_delivered:
            parts.append(f"{q.fail_delivered} failed-but-delivered")
        parts.append(f"{q.duplicated} dup")
        if self.ordered:
            parts.append(f"{o.reorder} reorder")
            if o.gap:
                parts.append(f"{o.gap} gap")
        if o.inconsistent_offsets:
            parts.append(f"{o.inconsistent_offsets} inconsistent offsets")
        never = [w for w in a.windows if w.failed_sends and w.rto_s is None]
        worst = a.worst_rto()
        if never:
            parts.append(f"worst rto never ({never[0].fault}: no ack after a failure)")
        elif worst is not None:
            where = "in fault" if worst.recovered_in_fault else "after heal"
            parts.append(f"worst rto {worst.rto_s:.2f} s ({where})")
        elif a.windows:
            parts.append("no failed send in a fault")
        if a.windows:
            gap = max(w.longest_gap_s for w in a.windows)
            parts.append(f"longest gap in a fault {gap:.2f} s")
        if a.never_recovered:
            parts.append(f"{a.never_recovered} fault(s) never recovered after heal")
        seed = "" if self.seed is None else f" seed={self.seed}"
        name = self.scenario or "run"
        return f"{'PASS' if self.valid else 'FAIL'} {name}{seed}: {', '.join(parts)}"

    def to_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "seed": self.seed,
            "ordered": self.ordered,
            "valid": self.valid,
            "verdict": self.verdict(),
            "queue": self.queue.to_json(),
            "order": self.order.to_json(),
            "availability": self.availability.to_json(),
            "latency": self.latency.to_json(),
        }


def check_all(
    ops: Sequence[Op],
    windows: Sequence[Window] | None = None,
    *,
    scenario: str = "",
    seed: int | None = None,
    ordered: bool = True,
) -> CheckReport:
    """Every checker over one history (indexed once). Windows default to the history's own
    nemesis ops; `ordered` says whether the run's keyed sends promised order."""
    ix = _index(ops)
    ws = _windows(ops, windows)
    return CheckReport(
        scenario=scenario,
        seed=seed,
        ordered=ordered,
        queue=_check_queue(ix),
        order=_check_order(ix),
        availability=_check_availability(ix, ws),
        latency=_check_latency(ix, ws),
    )


def check_leadership(before: tuple[str, int], after: tuple[str, int]) -> str | None:
    """A fault that leaves the leader a majority (a follower cut off, then back) must not cost it
    its leadership: the group's (leader, term) at the end is the one before the fault. What
    changed, in words, or None."""
    if before == after:
        return None
    (was, term), (now, new_term) = before, after
    if was != now:
        return f"leader changed: {was} (term {term}) -> {now} (term {new_term})"
    return f"term changed under leader {was}: {term} -> {new_term} (an election was forced)"


@dataclass(frozen=True, slots=True)
class NodeView:
    """What one group node says of itself at the end of a run (its status call)."""

    name: str
    answered: bool
    role: str
    term: int
    leader: str
    commit_index: int


def check_rejoined(nodes: Sequence[NodeView], target_commit: int) -> str | None:
    """After the heal every node of the group is back in it: all answer, one leads, all name it
    at its term, and every commit index reached `target_commit` (the leader's when the check
    began). A node that restarted and never heard its leader again breaks this while the
    queue checks still pass (two nodes are a majority). What is wrong, in words, or None."""
    mute = [n.name for n in nodes if not n.answered]
    if mute:
        return f"no status from {', '.join(mute)}"
    leaders = [n for n in nodes if n.role == "LEADER"]
    if len(leaders) != 1:
        return f"{len(leaders)} nodes say they lead: " + ", ".join(
            f"{n.name} {n.role} term {n.term}" for n in nodes
        )
    lead = leaders[0]
    apart = [n for n in nodes if n.term != lead.term or n.leader != lead.leader]
    if apart:
        return (
            "not following the leader "
            + f"{lead.name} (term {lead.term}): "
            + ", ".join(
                f"{n.name} {n.role} term {n.term} leader {n.leader or 'none'}" for n in apart
            )
        )
    behind = [n for n in nodes if n.commit_index < target_commit]
    if behind:
        return f"behind the leader's commit index {target_commit}: " + ", ".join(
            f"{n.name} at {n.commit_index}" for n in behind
        )
    return None
