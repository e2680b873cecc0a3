"""Raft's log-replication rules as values in, values out: the follower's AppendEntries decision and
the leader's handling of an acknowledgement (etcd-io/raft's log.go maybeAppend and Progress).

No sockets, threads, clocks or journal I/O here: pysyncobj_compat gathers the inputs, calls these
functions and does the writes and sends they name. A decision never truncates a matching entry.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from raftmq.raftlog.errors import CommittedEntryConflictError

# One entry as pysyncobj carries it on the wire and in its journal interface.
WireEntry = tuple[bytes, int, int]  # (command, index, term)


class LogView(Protocol):
    """What a decision reads of the local log: its bounds and the term of any stored index, all
    from memory (SegmentJournal keeps its term runs in memory)."""

    @property
    def first_index(self) -> int: ...

    @property
    def last_index(self) -> int: ...

    def term_at(self, index: int) -> int:
        """IndexError outside [first_index, last_index], except first_index - 1 when the log
        keeps its base's term."""
        ...


@dataclass(frozen=True, slots=True)
class AppendRequest:
    """The parts of an append_entries message the follower's decision depends on."""

    prev_index: int
    prev_term: int
    leader_commit: int
    entries: Sequence[WireEntry]  # consecutive indexes from prev_index + 1


@dataclass(frozen=True, slots=True)
class AppendReply:
    """The follower's answer (pysyncobj's next_node_idx message).

    success: next_index is one past the last entry this message proved we share with the leader.
    reject: next_index is where the leader should resume; `reset` lets it move nextIndex back.
    """

    success: bool
    next_index: int

    @property
    def reset(self) -> bool:
        return not self.success


@dataclass(frozen=True, slots=True)
class AppendDecision:
    """What the follower must do, in this order: truncate, append, (fsync), reply, commit."""

    truncate_from: int | None  # drop [truncate_from, last_index] first; None = keep everything
    append: Sequence[WireEntry]  # then append these, in order
    commit_index: int  # the follower's commit index afterwards (never below the old one)
    reply: AppendReply


@dataclass(frozen=True, slots=True)
class Progress:
    """The leader's view of one follower: match_index is known replicated there, next_index is
    the next index to send. Invariant: next_index >= match_index + 1."""

    match_index: int
    next_index: int


@dataclass(frozen=True, slots=True)
class Ack:
    """A follower's reply as the leader receives it."""

    next_index: int
    success: bool
    reset: bool


def follower_append(view: LogView, commit_index: int, msg: AppendRequest) -> AppendDecision:
    """The Raft paper's AppendEntries receiver rules (steps 2-5) for a message of the current term.

    Raises CommittedEntryConflictError if the leader's log disagrees with an entry this node
    already counts as committed: Raft's safety argument is broken and nothing may be served.
    """
    first, last = view.first_index, view.last_index
    prev = msg.prev_index
    for k, (_, index, _) in enumerate(msg.entries):
        if index != prev + 1 + k:
            raise ValueError(
                f"append_entries from prev_index {prev} carries index {index} at position {k}"
            )
    if prev > last or prev < first - 1:
        # We lack prev (or retention removed it): the leader resumes from our end.
        return _reject(commit_index, last + 1)
    try:
        # prev == first - 1: the base a retention cut or a snapshot install left, if known.
        our_prev_term = view.term_at(prev)
    except IndexError:
        return _reject(commit_index, last + 1)
    if our_prev_term != msg.prev_term:
        if prev <= commit_index:
            raise CommittedEntryConflictError(prev, commit_index, our_prev_term, msg.prev_term)
        # Skip our whole conflicting term run in one round trip instead of one entry per trip,
        # but never below what is committed here.
        return _reject(commit_index, max(first_index_of_term_run(view, prev), commit_index + 1))

    truncate_from: int | None = None
    start = len(msg.entries)
    for k, (_, index, term) in enumerate(msg.entries):
        if index > last:
            start = k
            break
        ours = view.term_at(index)
        if ours == term:
            continue  # already stored (a re-sent range): a match is never truncated
        if index <= commit_index:
            raise CommittedEntryConflictError(index, commit_index, ours, term)
        truncate_from = index
        start = k
        break
    last_new = msg.entries[-1][1] if msg.entries else prev
    # Commit only what this message proved we share with the leader.
    commit = max(commit_index, min(msg.leader_commit, last_new))
    return AppendDecision(
        truncate_from=truncate_from,
        append=msg.entries[start:],
        commit_index=commit,
        reply=AppendReply(success=True, next_index=last_new + 1),
    )


def leader_on_ack(progress: Progress, ack: Ack) -> Progress:
    """The leader's update of one follower's progress on its reply.

    A success only ever moves match and next forward: replies to pipelined messages arrive late,
    and re-sending what is in flight costs bandwidth (pysyncobj's stock rule rewinds). A reset
    moves next to the follower's hint; if that lies at or below match, the follower lost entries
    it had acknowledged (a restart after ASYNC_FLUSH), so match comes down with it.
    """
    if ack.success:
        return Progress(
            match_index=max(progress.match_index, ack.next_index - 1),
            next_index=max(progress.next_index, ack.next_index),
        )
    if ack.reset:
        return Progress(
            match_index=min(progress.match_index, ack.next_index - 1),
            next_index=ack.next_index,
        )
    return progress


def first_index_of_term_run(view: LogView, index: int) -> int:
    """Smallest i <= index with term_at(i) == term_at(index) (terms never decrease in a log)."""
    term = view.term_at(index)
    lo, hi = view.first_index, index
    while lo < hi:
        mid = (lo + hi) // 2
        if view.term_at(mid) == term:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _reject(commit_index: int, next_index: int) -> AppendDecision:
    return AppendDecision(
        truncate_from=None,
        append=(),
        commit_index=commit_index,
        reply=AppendReply(success=False, next_index=next_index),
    )
