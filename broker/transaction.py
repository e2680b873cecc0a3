"""Transactional half messages as a deterministic state machine: HALF -> COMMITTED / ROLLED_BACK,
or MOVED for inspection after `max_checks` unanswered check-backs; and the leader's decisions of
which half messages to check now and which live producer of the group to ask.

Every replica applies the same committed events in log order (half stored, end, check sent, moved)
and so holds the same table; the leader alone calls `due_checks`. No clock, no I/O, no threads.
"""

from __future__ import annotations

import bisect
import enum
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from raftmq.broker.schedule import MessageRef
from raftmq.common.errors import (
    RaftMQError,
    TransactionConflictError,
    TransactionNotFoundError,
)

DEFAULT_TRANSACTION_TIMEOUT_MS = 6_000  # RocketMQ transactionTimeOut
DEFAULT_CHECK_INTERVAL_MS = 60_000  # RocketMQ transactionCheckInterval
DEFAULT_MAX_CHECKS = 15  # RocketMQ transactionCheckMax
DEFAULT_ENDED_RETENTION_MS = 3_600_000  # how long an ended id is remembered (idempotent ends)
DEFAULT_CHECK_BATCH = 64

# Where a half message given up on is moved (RocketMQ's TRANS_CHECK_MAX_TIME_TOPIC).
MOVED_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"


class TxnState(enum.Enum):
    HALF = "half"  # stored, invisible, outcome unknown
    COMMITTED = "committed"  # visible (exactly once, at the apply of the commit)
    ROLLED_BACK = "rolled back"
    MOVED = "moved"  # max checks reached: in MOVED_TOPIC for a person, never visible


class Resolution(enum.Enum):
    COMMIT = "commit"
    ROLLBACK = "rollback"
    UNKNOWN = "unknown"  # the producer does not know yet: check again later


class EndOutcome(enum.Enum):
    VISIBLE = "visible"  # HALF -> COMMITTED: add the real topic's ConsumeQueue rows for `ref`
    DROPPED = "dropped"  # HALF -> ROLLED_BACK
    ALREADY = "already"  # the same end again, or a rollback of a moved one: success, no change
    STILL_HALF = "still half"  # UNKNOWN: nothing changes, the next check stays scheduled
    NOT_FOUND = "not found"
    CONFLICT = "conflict"  # ended the other way: nothing changes


@dataclass(frozen=True, slots=True)
class TxnSettings:
    transaction_timeout_ms: int = DEFAULT_TRANSACTION_TIMEOUT_MS
    check_interval_ms: int = DEFAULT_CHECK_INTERVAL_MS
    max_checks: int = DEFAULT_MAX_CHECKS
    ended_retention_ms: int = DEFAULT_ENDED_RETENTION_MS

    def __post_init__(self) -> None:
        for name in ("transaction_timeout_ms", "check_interval_ms", "ended_retention_ms"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.max_checks < 0:
            raise ValueError(f"max_checks must be >= 0, got {self.max_checks}")


@dataclass(slots=True)
class Txn:
    txn_id: str
    producer_group: str
    producer_client: str  # the client that sent the half message
    ref: MessageRef  # the half message's bytes; its topic/queue are the real ones
    stored_ms: int
    state: TxnState = TxnState.HALF
    checks: int = 0
    next_check_ms: int = 0
    last_check_client: str | None = None  # asked last and did not resolve it
    ended_ms: int | None = None


@dataclass(frozen=True, slots=True)
class EndResult:
    outcome: EndOutcome
    txn_id: str
    state: TxnState | None  # the state after the apply (None: unknown id)
    ref: MessageRef | None = None  # VISIBLE: what became visible
    wanted: Resolution | None = None

    def error(self) -> RaftMQError | None:
        """The typed error to answer the producer with, if any (the leader raises it)."""
        if self.outcome is EndOutcome.NOT_FOUND:
            return TransactionNotFoundError.for_id(self.txn_id)
        if self.outcome is EndOutcome.CONFLICT:
            assert self.state is not None and self.wanted is not None
            verb = "committed" if self.wanted is Resolution.COMMIT else "rolled back"
            return TransactionConflictError.for_end(self.txn_id, self.state.value, verb)
        return None


@dataclass(frozen=True, slots=True)
class CheckAction:
    """Propose "check sent" for `txn_id` asking `client` (None: no live producer of the group;
    the attempt still counts, as in RocketMQ), then, once it is applied, send the check."""

    txn_id: str
    producer_group: str
    client: str | None
    ref: MessageRef


@dataclass(frozen=True, slots=True)
class MoveAction:
    """Propose "moved": `max_checks` checks went unanswered; the half goes to MOVED_TOPIC."""

    txn_id: str
    ref: MessageRef
    checks: int


def choose_producer(
    members: Sequence[str], cursor: int, avoid: str | None
) -> tuple[str | None, int]:
    """Round robin over the live members (sorted), skipping `avoid` (the member that failed last)
    unless it is the only one. Returns the choice and the next cursor."""
    live = sorted(set(members))
    if not live:
        return None, cursor
    candidates = [m for m in live if m != avoid] or live
    return candidates[cursor % len(candidates)], cursor + 1


@dataclass
class TransactionBook:
    """The replicated transaction table and the leader's check decisions."""

    settings: TxnSettings = field(default_factory=TxnSettings)
    _open: dict[str, Txn] = field(default_factory=dict)  # HALF only
    _check_order: list[tuple[int, str]] = field(default_factory=list)  # (next_check_ms, id)
    _ended: OrderedDict[str, Txn] = field(default_factory=OrderedDict)  # in apply order
    _producers: dict[str, set[str]] = field(default_factory=dict)  # group -> live client ids
    _cursor: dict[str, int] = field(default_factory=dict)
    _inflight: set[str] = field(default_factory=set)  # leader: proposed, not applied yet
    # Ids forgotten since the last take_forgotten(), when a persistent shell must delete them too.
    track_forgotten: bool = False
    _forgotten: list[str] = field(default_factory=list)

    # ---- apply: every replica, in log order ---------------------------------------------------

    def apply_half(
        self,
        txn_id: str,
        producer_group: str,
        producer_client: str,
        ref: MessageRef,
        store_ms: int,
        check_immunity_ms: int | None = None,
    ) -> None:
        """A half message was stored at `store_ms`: invisible; first check after the timeout
        (or the message's CHECK_IMMUNITY_TIME, if longer)."""
        self._forget_ended(store_ms)
        if txn_id in self._open or txn_id in self._ended:
            raise ValueError(f"transaction id {txn_id!r} is stored already; ids must be unique")
        wait_ms = max(self.settings.transaction_timeout_ms, check_immunity_ms or 0)
        txn = Txn(txn_id, producer_group, producer_client, ref, store_ms)
        txn.next_check_ms = store_ms + wait_ms
        self._open[txn_id] = txn
        bisect.insort(self._check_order, (txn.next_check_ms, txn_id))

    def apply_end(
        self, txn_id: str, resolution: Resolution, ts_ms: int, *, from_check: bool = False
    ) -> EndResult:
        """An end-transaction (from the producer, or its answer to a check) committed. Never
        raises for the request's content: a replica must apply every committed entry alike."""
        self._forget_ended(ts_ms)
        txn = self._open.get(txn_id)
        if txn is None:
            return self._end_of_ended(txn_id, resolution)
        if resolution is Resolution.UNKNOWN:
            return EndResult(EndOutcome.STILL_HALF, txn_id, TxnState.HALF, wanted=resolution)
        committed = resolution is Resolution.COMMIT
        self._close(txn, TxnState.COMMITTED if committed else TxnState.ROLLED_BACK, ts_ms)
        outcome = EndOutcome.VISIBLE if committed else EndOutcome.DROPPED
        return EndResult(outcome, txn_id, txn.state, txn.ref if committed else None, resolution)

    def apply_check_sent(self, txn_id: str, ts_ms: int, client: str | None) -> bool:
        """The leader recorded a check of `txn_id` asking `client` at `ts_ms`; False if the
        transaction ended meanwhile (the check is then not sent)."""
        self._inflight.discard(txn_id)
        self._forget_ended(ts_ms)
        txn = self._open.get(txn_id)
        if txn is None:
            return False
        self._unindex(txn)
        txn.checks += 1
        txn.last_check_client = client
        txn.next_check_ms = ts_ms + self.settings.check_interval_ms
        bisect.insort(self._check_order, (txn.next_check_ms, txn_id))
        return True

    def apply_moved(self, txn_id: str, ts_ms: int) -> MessageRef | None:
        """Max checks reached: the half leaves the table for MOVED_TOPIC (the ref to index
        there), or None if it ended meanwhile."""
        self._inflight.discard(txn_id)
        self._forget_ended(ts_ms)
        txn = self._open.get(txn_id)
        if txn is None:
            return None
        self._close(txn, TxnState.MOVED, ts_ms)
        return txn.ref

    def restore(self, txns: Iterable[Txn]) -> None:
        """Load a persisted table into an empty book: open halves and ended transactions, the
        ended ones in the order they ended (the order forgetting follows)."""
        if self._open or self._ended:
            raise ValueError("restore() fills an empty book only")
        for txn in txns:
            if txn.state is TxnState.HALF:
                self._open[txn.txn_id] = txn
                bisect.insort(self._check_order, (txn.next_check_ms, txn.txn_id))
            else:
                self._ended[txn.txn_id] = txn

    def take_forgotten(self) -> list[str]:
        """Ended ids forgotten since the last call (with track_forgotten on)."""
        out, self._forgotten = self._forgotten, []
        return out

    # ---- the live producers (heartbeats; the choice is recorded in "check sent") ---------------

    def producer_up(self, group: str, client: str) -> None:
        self._producers.setdefault(group, set()).add(client)

    def producer_down(self, group: str, client: str) -> None:
        members = self._producers.get(group)
        if members is not None:
            members.discard(client)
            if not members:
                del self._producers[group]

    def live_producers(self, group: str) -> tuple[str, ...]:
        return tuple(sorted(self._producers.get(group, ())))

    # ---- leader decisions -----------------------------------------------------------------------

    def validate_end(self, txn_id: str, resolution: Resolution) -> None:
        """Before proposing an end: raise the typed error a producer should get now. The apply
        decides again (a concurrent end may commit first) and its EndResult has the last word."""
        txn = self._open.get(txn_id)
        if txn is None:
            error = self._end_of_ended(txn_id, resolution).error()
            if error is not None:
                raise error

    def due_checks(
        self, now_ms: int, limit: int = DEFAULT_CHECK_BATCH
    ) -> list[CheckAction | MoveAction]:
        """Half messages whose check is due at now_ms, earliest first, at most `limit`, skipping
        those proposed and not applied yet. Each is a check (with the producer to ask) or, after
        max_checks checks, a move."""
        actions: list[CheckAction | MoveAction] = []
        for due_ms, txn_id in self._check_order:
            if due_ms > now_ms or len(actions) >= limit:
                break
            if txn_id in self._inflight:
                continue
            txn = self._open[txn_id]
            self._inflight.add(txn_id)
            if txn.checks >= self.settings.max_checks:
                actions.append(MoveAction(txn_id, txn.ref, txn.checks))
                continue
            group = txn.producer_group
            client, self._cursor[group] = choose_producer(
                self.live_producers(group), self._cursor.get(group, 0), txn.last_check_client
            )
            actions.append(CheckAction(txn_id, group, client, txn.ref))
        return actions

    def proposal_failed(self, txn_ids: Iterable[str]) -> None:
        """Proposals that did not commit: their transactions may be taken again."""
        self._inflight.difference_update(txn_ids)

    def lost_leadership(self) -> None:
        self._inflight.clear()

    def next_check_ms(self) -> int | None:
        """When the leader's timer should fire next (None: no half message open)."""
        return self._check_order[0][0] if self._check_order else None

    # ---- reads ----------------------------------------------------------------------------------

    def state(self, txn_id: str) -> TxnState | None:
        txn = self._open.get(txn_id) or self._ended.get(txn_id)
        return txn.state if txn is not None else None

    def get(self, txn_id: str) -> Txn | None:
        return self._open.get(txn_id) or self._ended.get(txn_id)

    @property
    def open_count(self) -> int:
        return len(self._open)

    @property
    def ended_count(self) -> int:
        return len(self._ended)

    # ---- internals ------------------------------------------------------------------------------

    def _end_of_ended(self, txn_id: str, resolution: Resolution) -> EndResult:
        txn = self._ended.get(txn_id)
        if txn is None:
            return EndResult(EndOutcome.NOT_FOUND, txn_id, None, wanted=resolution)
        same = {
            Resolution.COMMIT: (TxnState.COMMITTED,),
            Resolution.ROLLBACK: (TxnState.ROLLED_BACK, TxnState.MOVED),
            Resolution.UNKNOWN: (),
        }[resolution]
        if txn.state in same:
            return EndResult(EndOutcome.ALREADY, txn_id, txn.state, wanted=resolution)
        if resolution is Resolution.UNKNOWN:
            return EndResult(EndOutcome.ALREADY, txn_id, txn.state, wanted=resolution)
        return EndResult(EndOutcome.CONFLICT, txn_id, txn.state, wanted=resolution)

    def _close(self, txn: Txn, state: TxnState, ts_ms: int) -> None:
        self._unindex(txn)
        del self._open[txn.txn_id]
        self._inflight.discard(txn.txn_id)
        txn.state = state
        txn.ended_ms = ts_ms
        self._ended[txn.txn_id] = txn

    def _unindex(self, txn: Txn) -> None:
        i = bisect.bisect_left(self._check_order, (txn.next_check_ms, txn.txn_id))
        if i < len(self._check_order) and self._check_order[i] == (txn.next_check_ms, txn.txn_id):
            del self._check_order[i]

    def _forget_ended(self, ts_ms: int) -> None:
        """Ended ids are kept `ended_retention_ms` (by apply order and entry time, so every
        replica forgets the same ones), then an end for them is NOT_FOUND."""
        horizon = ts_ms - self.settings.ended_retention_ms
        while self._ended:
            txn = next(iter(self._ended.values()))
            if txn.ended_ms is None or txn.ended_ms > horizon:
                break
            forgotten, _ = self._ended.popitem(last=False)
            if self.track_forgotten:
                self._forgotten.append(forgotten)
