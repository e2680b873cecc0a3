"""Retention's decisions as values in, values out: where the leader cuts the CommitLog, which
groups lose what, whether a consumer's offset was deleted by retention, when the disk guard
refuses writes. No clock, no lmdb, no journal here: the retention service (retention_service.py)
gathers the inputs and does what these functions name; the store applies a cut on every replica.

The protocol (docs/design.md, "Retention"): the leader proposes a RETENTION record; every
replica applies it at the same log position, so every replica cuts its indexes at the same
place. Each record also leaves a *base*: the broker's small replicated state as of the record's
own index. A cut may only fall right after a base (cut = base + 1): queue min offsets become the
queue heads of that base, and a follower behind the cut is sent that base as its snapshot.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from raftmq.common.record_batch import Kind, MalformedBatchError
from raftmq.raftlog.journal import SegmentInfo

MAX_BASES = 8  # bases kept besides the one the current cut stands on
_RECORD = struct.Struct("<BBBxIQq")  # kind, version, reason, pad, reserved, cut index, decided ms
_VERSION = 1


class Reason(enum.IntEnum):
    MARK = 0  # no cut: only leaves a base for a later cut
    TIME = 1  # segments older than retention_ms
    SIZE = 2  # the journal is over retention_bytes


@dataclass(frozen=True, slots=True)
class RetentionRecord:
    """The replicated decision. cut_index 0: no cut (a mark)."""

    cut_index: int
    reason: Reason
    decided_at_ms: int  # the leader's clock when it decided: for logs only, never for apply


def encode_record(rec: RetentionRecord) -> bytes:
    if rec.cut_index < 0:
        raise ValueError(f"cut index {rec.cut_index} is negative")
    return _RECORD.pack(
        Kind.RETENTION, _VERSION, int(rec.reason), 0, rec.cut_index, rec.decided_at_ms
    )


def is_retention_chunk(chunk: bytes) -> bool:
    return len(chunk) > 0 and chunk[0] == Kind.RETENTION


def decode_record(chunk: bytes) -> RetentionRecord:
    if len(chunk) != _RECORD.size:
        raise MalformedBatchError(f"retention record of {len(chunk)} bytes, not {_RECORD.size}")
    kind, version, reason, _, cut, decided = _RECORD.unpack(chunk)
    if kind != Kind.RETENTION or version != _VERSION:
        raise MalformedBatchError(f"retention record of kind {kind} version {version}")
    try:
        why = Reason(reason)
    except ValueError as exc:
        raise MalformedBatchError(f"retention record with unknown reason {reason}") from exc
    return RetentionRecord(cut, why, decided)


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    retention_ms: int  # segments whose last write is older are deleted; 0 = no time limit
    retention_bytes: int  # oldest segments go while the journal is larger; 0 = no size limit


@dataclass(frozen=True, slots=True)
class Proposal:
    record: RetentionRecord
    wanted_first_index: int  # where the policy would cut if a base stood right before it


QUIET_MARK_MAX_MS = 60_000  # a quiet journal gets its mark at most this long after its last write


def quiet_mark_ms(policy: RetentionPolicy) -> int:
    """How long the active segment must be quiet before the leader marks it (a base after its
    last message, so time retention can later cut through it); 0: never (no time limit)."""
    return min(policy.retention_ms // 2, QUIET_MARK_MAX_MS) if policy.retention_ms > 0 else 0


def wanted_first_index(
    segments: Sequence[SegmentInfo], policy: RetentionPolicy, now_ms: int
) -> tuple[int, Reason]:
    """The first index the policy keeps: the first segment not expired by age and not needed to
    bring the journal under its size limit. The active segment is kept unless it is older than
    retention_ms itself (a quiet journal: no write rolled it): its mtime is its last write, so
    every entry in it is older too. Its file stays until it rolls; the cut makes its messages
    unreadable and trims their index rows on every replica."""
    total = sum(s.size_bytes for s in segments)
    keep_from = segments[0].first_index if segments else 1
    reason = Reason.MARK
    for seg in segments:
        old = policy.retention_ms > 0 and seg.mtime_ms < now_ms - policy.retention_ms
        if seg.active:
            if old:
                keep_from, reason = seg.last_index + 1, Reason.TIME
            break
        big = policy.retention_bytes > 0 and total > policy.retention_bytes
        if not (old or big):
            break
        reason = Reason.TIME if old else Reason.SIZE
        total -= seg.size_bytes
        keep_from = seg.last_index + 1
    return keep_from, reason


def decide(
    segments: Sequence[SegmentInfo],
    bases: Iterable[int],
    cut_index: int,
    dispatched_index: int,
    policy: RetentionPolicy,
    now_ms: int,
    floor_index: int | None = None,
) -> Proposal | None:
    """What the leader proposes now, if anything: a cut right after the newest base the policy
    allows (never past what this node has indexed, nor past `floor_index`, the oldest entry
    replicated state still points into), and a mark when no base lies in the active segment
    yet (so the next boundary has a base right before it)."""
    if not segments:
        return None
    wanted, reason = wanted_first_index(segments, policy, now_ms)
    wanted = min(wanted, dispatched_index + 1)
    if floor_index is not None:
        wanted = min(wanted, floor_index)
    known = sorted(bases)
    fits = [b for b in known if cut_index <= b and b + 1 <= wanted]
    new_cut = fits[-1] + 1 if fits and fits[-1] + 1 > cut_index else 0
    active = segments[-1]
    # A base before every segment boundary; and, once the active segment has gone quiet, one
    # after its last entry, or time retention could never cut through a quiet journal.
    quiet = quiet_mark_ms(policy)
    need_mark = (
        not known
        or known[-1] < active.first_index - 1
        or (quiet > 0 and active.mtime_ms <= now_ms - quiet and known[-1] < active.last_index)
    )
    if new_cut:
        return Proposal(RetentionRecord(new_cut, reason, now_ms), wanted)
    if need_mark:
        return Proposal(RetentionRecord(0, Reason.MARK, now_ms), wanted)
    return None


@dataclass(frozen=True, slots=True)
class NextCut:
    cut_index: int
    due_ms: int  # when the policy lets the leader propose it (now or later)


NEXT_CUT_SEGMENTS = 4  # segments looked ahead at most (each look is one decide())


def next_cut(
    segments: Sequence[SegmentInfo],
    bases: Iterable[int],
    cut_index: int,
    dispatched_index: int,
    policy: RetentionPolicy,
    now_ms: int,
    floor_index: int | None = None,
) -> NextCut | None:
    """The cut the leader will propose next, and when: decide() now, else decide() as of the
    moment the oldest segments still above the cut age out. What retention warns about before
    it deletes. None: no cut in sight (no limit, or no base to stand on yet). The size limit is
    only seen once passed (when a journal will grow past it is not known)."""
    known = list(bases)
    p = decide(segments, known, cut_index, dispatched_index, policy, now_ms, floor_index)
    if p is not None and p.record.cut_index:
        return NextCut(p.record.cut_index, now_ms)
    if policy.retention_ms <= 0:
        return None
    ahead = [s for s in segments if s.last_index >= cut_index][:NEXT_CUT_SEGMENTS]
    for seg in ahead:
        due = max(now_ms, seg.mtime_ms + policy.retention_ms + 1)
        p = decide(segments, known, cut_index, dispatched_index, policy, due, floor_index)
        if p is not None and p.record.cut_index:
            return NextCut(p.record.cut_index, due)
    return None


def bases_to_keep(bases: Iterable[int], cut_index: int) -> list[int]:
    """The bases a replica keeps after a cut: the one the cut stands on and the newest
    MAX_BASES after it; older ones describe deleted entries."""
    later = sorted(b for b in bases if b >= cut_index)
    on_cut = [b for b in bases if b == cut_index - 1]
    return sorted(set(on_cut + later[-MAX_BASES:]))


@dataclass(frozen=True, slots=True)
class QueueCut:
    topic: str
    queue_id: int
    old_min: int
    new_min: int


def new_min_offsets(
    current: Mapping[tuple[str, int], tuple[int, int]],
    base_heads: Mapping[tuple[str, int], int],
) -> list[QueueCut]:
    """Queues whose min offset a cut right after a base advances: to the base's next offset
    (every message at or after it was stored after the base). `current`: (min, next) now."""
    out: list[QueueCut] = []
    for key in sorted(base_heads):
        if key not in current:
            continue  # the topic was deleted since the base
        old_min, nxt = current[key]
        new_min = min(max(old_min, base_heads[key]), nxt)
        if new_min > old_min:
            out.append(QueueCut(key[0], key[1], old_min, new_min))
    return out


@dataclass(frozen=True, slots=True)
class GroupLoss:
    group: str
    topic: str
    queues: int
    messages: int


def losses(
    committed: Iterable[tuple[str, str, int, int]], cuts: Iterable[QueueCut]
) -> list[GroupLoss]:
    """Per (group, topic): messages deleted by the cut that the group had not consumed (its
    committed offset lay below the new min offset)."""
    by_queue = {(c.topic, c.queue_id): c for c in cuts}
    acc: dict[tuple[str, str], list[int]] = {}
    for group, topic, queue_id, offset in committed:
        cut = by_queue.get((topic, queue_id))
        if cut is None or offset >= cut.new_min:
            continue
        lost = cut.new_min - max(offset, cut.old_min)
        row = acc.setdefault((group, topic), [0, 0])
        row[0] += 1
        row[1] += lost
    return [GroupLoss(g, t, q, m) for (g, t), (q, m) in sorted(acc.items())]


def deleted_by_retention(offset: int, min_offset: int, cut_index: int) -> bool:
    """A pull below the queue's min offset asks for messages retention deleted (the min offset
    moves only by retention; before any cut it is 0)."""
    return cut_index > 0 and 0 <= offset < min_offset


@dataclass(frozen=True, slots=True)
class DiskLimits:
    max_store_bytes: int  # journal + index bytes of this node; 0 = no limit
    max_used_ratio: float  # of the file system holding data_dir; >= 1.0 = no limit


RESUME_FRACTION = 0.95  # writes resume below this fraction of a limit (no flapping at the edge)


def disk_pressure(
    limits: DiskLimits, store_bytes: int, fs_used_ratio: float, refusing: bool
) -> str | None:
    """Why writes must be refused now (a sentence), or None. Once refusing, writes resume only
    below RESUME_FRACTION of the limit that was passed."""
    f = RESUME_FRACTION if refusing else 1.0
    if limits.max_store_bytes > 0 and store_bytes >= limits.max_store_bytes * f:
        return (
            f"this node stores {store_bytes} bytes, at its limit max_store_bytes="
            f"{limits.max_store_bytes}"
        )
    if limits.max_used_ratio < 1.0 and fs_used_ratio >= limits.max_used_ratio * f:
        return (
            f"its disk is {fs_used_ratio:.0%} full, at its limit disk_max_used_ratio="
            f"{limits.max_used_ratio:.2f}"
        )
    return None
