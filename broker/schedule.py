"""The schedule of delayed messages as a deterministic state machine over an on-disk index.

Every replica applies the same committed events (`apply_scheduled`, `apply_deliver`) in log order
and reaches the same index; only the leader asks `take_due(now_ms)` and proposes a delivery. The
index is keyed by (due_ms, seq) and read in due order; memory holds at most the leader's in-flight
window, never the schedule. Nothing here reads a clock, writes a file or proposes anything itself.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

DEFAULT_DELIVER_BATCH = 256  # entries per proposed delivery (one Raft entry)
DEFAULT_MAX_INFLIGHT_BATCHES = 4  # proposals awaiting commit on the leader


@dataclass(frozen=True, slots=True, order=True)
class ScheduleKey:
    """Where a scheduled message sits in the index: due order, then the order it was scheduled.

    `seq` is unique per broker group and assigned deterministically by the apply of the entry
    that stored the message (the delay topic's queue offset), so every replica has the same key.
    """

    due_ms: int
    seq: int


@dataclass(frozen=True, slots=True)
class MessageRef:
    """The stored delayed message: its bytes stay where the producer's entry put them (the Raft
    log is the CommitLog); delivery adds ConsumeQueue rows for the real topic pointing here."""

    raft_index: int
    slot: int
    position: int
    topic: str  # the real topic (RocketMQ's REAL_TOPIC)
    queue_id: int  # the real queue (REAL_QID)
    # What the ConsumeQueue row of the real topic needs besides the location, so delivery reads
    # nothing but the index: where the record starts in its chunk, its body size, its tag hash.
    chunk_offset_bytes: int = 0
    body_bytes: int = 0
    tag_hash: int = 0
    # The message's keys: delivery writes the real topic's key index rows from them (RocketMQ
    # indexes a delayed message under its real topic only when it is put back at its due time).
    keys: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ScheduleEntry:
    key: ScheduleKey
    ref: MessageRef


class ScheduleIndex(Protocol):
    """The storage the broker provides: an ordered on-disk map (lmdb: big-endian u64 due_ms +
    u64 seq as the key), written only by apply, inside the same transaction that records the
    applied Raft index, so a restart neither loses nor re-applies an event."""

    def put(self, key: ScheduleKey, ref: MessageRef) -> None:
        """Insert; putting the same key with the same ref again changes nothing."""
        ...

    def scan_due(self, upto_ms: int, limit: int) -> list[ScheduleEntry]:
        """At most `limit` entries with due_ms <= upto_ms, in key order."""
        ...

    def scan_after(
        self, after: ScheduleKey | None, upto_ms: int, limit: int
    ) -> list[ScheduleEntry]:
        """As scan_due, starting strictly after `after` (None: from the start)."""
        ...

    def delete(self, key: ScheduleKey) -> MessageRef | None:
        """Remove and return the entry, or None if it is not there (already delivered)."""
        ...

    def first_due_ms(self) -> int | None:
        """The earliest due time, or None when the schedule is empty."""
        ...

    def count(self) -> int: ...


class MemoryScheduleIndex:
    """The ScheduleIndex for tests: a sorted key list beside a dict."""

    def __init__(self) -> None:
        self._keys: list[ScheduleKey] = []
        self._refs: dict[ScheduleKey, MessageRef] = {}

    def put(self, key: ScheduleKey, ref: MessageRef) -> None:
        old = self._refs.get(key)
        if old is not None:
            if old != ref:
                raise ValueError(f"schedule key {key} already holds {old}, not {ref}")
            return
        self._refs[key] = ref
        bisect.insort(self._keys, key)

    def scan_due(self, upto_ms: int, limit: int) -> list[ScheduleEntry]:
        return self.scan_after(None, upto_ms, limit)

    def scan_after(
        self, after: ScheduleKey | None, upto_ms: int, limit: int
    ) -> list[ScheduleEntry]:
        start = 0 if after is None else bisect.bisect_right(self._keys, after)
        out: list[ScheduleEntry] = []
        for key in self._keys[start:]:
            if key.due_ms > upto_ms or len(out) >= limit:
                break
            out.append(ScheduleEntry(key, self._refs[key]))
        return out

    def delete(self, key: ScheduleKey) -> MessageRef | None:
        ref = self._refs.pop(key, None)
        if ref is not None:
            del self._keys[bisect.bisect_left(self._keys, key)]
        return ref

    def first_due_ms(self) -> int | None:
        return self._keys[0].due_ms if self._keys else None

    def count(self) -> int:
        return len(self._keys)


@dataclass(frozen=True, slots=True)
class DeliverProposal:
    """ "Deliver these": what the leader proposes through the log. `now_ms` is the leader's time
    at the decision; the entry's store time (not earlier) is what apply checks against."""

    keys: tuple[ScheduleKey, ...]
    now_ms: int


@dataclass(frozen=True, slots=True)
class DeliverOutcome:
    """What applying one delivery entry did, the same on every replica."""

    delivered: tuple[ScheduleEntry, ...]  # add ConsumeQueue rows of the real topic for these
    already: tuple[ScheduleKey, ...]  # delivered by an earlier entry (a deposed leader's)
    early: tuple[ScheduleKey, ...]  # not due at the entry's time: left in the schedule


@dataclass
class Schedule:
    """The replicated schedule and the leader's in-flight window over one ScheduleIndex."""

    index: ScheduleIndex
    deliver_batch: int = DEFAULT_DELIVER_BATCH
    max_inflight_batches: int = DEFAULT_MAX_INFLIGHT_BATCHES
    _inflight: dict[ScheduleKey, None] = field(default_factory=dict)  # leader only, ordered
    _inflight_batches: int = 0

    def __post_init__(self) -> None:
        if self.deliver_batch < 1 or self.max_inflight_batches < 1:
            raise ValueError("deliver_batch and max_inflight_batches must be at least 1")

    # ---- apply: every replica, in log order ---------------------------------------------------

    def apply_scheduled(self, key: ScheduleKey, ref: MessageRef) -> None:
        """A delayed message was stored (its entry committed): hold it until key.due_ms."""
        if key.due_ms < 0 or key.seq < 0:
            raise ValueError(f"schedule key {key} has a negative part")
        self.index.put(key, ref)

    def apply_deliver(self, keys: Iterable[ScheduleKey], entry_ts_ms: int) -> DeliverOutcome:
        """A "deliver" entry committed with store time `entry_ts_ms`. Idempotent: a key that is
        gone was delivered by an earlier entry and is skipped, so two leaders proposing the same
        key deliver it once; a key not due at `entry_ts_ms` is refused (never early)."""
        delivered: list[ScheduleEntry] = []
        already: list[ScheduleKey] = []
        early: list[ScheduleKey] = []
        for key in keys:
            self._inflight.pop(key, None)
            if key.due_ms > entry_ts_ms:
                early.append(key)
                continue
            ref = self.index.delete(key)
            if ref is None:
                already.append(key)
            else:
                delivered.append(ScheduleEntry(key, ref))
        return DeliverOutcome(tuple(delivered), tuple(already), tuple(early))

    # ---- leader decisions -----------------------------------------------------------------------

    def take_due(self, now_ms: int) -> DeliverProposal | None:
        """The next batch to propose: due at now_ms, in due order, not already in flight; None
        if nothing is due or the in-flight window is full. The caller proposes it, then reports
        the outcome with `apply_deliver` (commit) or `proposal_failed` (not committed)."""
        if self._inflight_batches >= self.max_inflight_batches:
            return None
        keys: list[ScheduleKey] = []
        after: ScheduleKey | None = None
        # In-flight keys are the earliest due ones, so skipping them costs at most the window.
        while len(keys) < self.deliver_batch:
            want = self.deliver_batch - len(keys) + len(self._inflight)
            page = self.index.scan_after(after, now_ms, want)
            for entry in page:
                if entry.key not in self._inflight and len(keys) < self.deliver_batch:
                    keys.append(entry.key)
            if len(page) < want:
                break
            after = page[-1].key
        if not keys:
            return None
        for key in keys:
            self._inflight[key] = None
        self._inflight_batches += 1
        return DeliverProposal(tuple(keys), now_ms)

    def proposal_done(self, proposal: DeliverProposal) -> None:
        """The proposal committed (after its apply) or failed: its slot in the window is free;
        keys not applied (a failed proposal) may be taken again."""
        for key in proposal.keys:
            self._inflight.pop(key, None)
        self._inflight_batches = max(0, self._inflight_batches - 1)

    def lost_leadership(self) -> None:
        """Forget the in-flight window: a proposal of the old term may still commit, and its
        apply then delivers; a new leader's duplicate proposal is skipped by apply."""
        self._inflight.clear()
        self._inflight_batches = 0

    def next_due_ms(self) -> int | None:
        """When the leader's timer should fire next (None: nothing scheduled)."""
        return self.index.first_due_ms()

    @property
    def inflight_count(self) -> int:
        return len(self._inflight)


def check_batch_order(entries: Sequence[ScheduleEntry]) -> bool:
    """True when a batch is in due order (then schedule order): what apply hands the dispatcher."""
    return all(a.key <= b.key for a, b in itertools.pairwise(entries))
