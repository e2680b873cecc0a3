"""Transactional messages on a broker node: the thin shell around broker/transaction.py.

- SendHalfMessage: the user's message, validated as any send, stored as a one-message produce
  batch carrying the half properties; the dispatcher (broker/txn_apply.py) keeps it out of the
  ConsumeQueue and records it in the replicated TransactionBook.
- EndTransaction: validated against the book (typed errors, no entry), then a TXN_END entry;
  the apply's EndResult has the last word (a concurrent end may have come first).
- Check-back: the leader's loop asks `due_checks`, proposes TXN_CHECK / TXN_MOVED entries and,
  once a check is applied, hands it to the chosen producer's long poll (PollTransactionChecks).
  The broker never connects to a client: producers keep a poll open on the group's leader, and
  that poll is also what makes them live members of their group here (leader-local soft state,
  like RocketMQ's ProducerManager; a new leader learns the members from their next poll).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass, field

from raftmq.broker.convert import message_from_pb, stored_to_pb
from raftmq.broker.node import BrokerNode
from raftmq.broker.produce import encode_stored
from raftmq.broker.rows import Appended, Applied, ChunkOutcome, Duplicate, Rejected
from raftmq.broker.transaction import (
    CheckAction,
    EndOutcome,
    MoveAction,
    Resolution,
    TxnState,
)
from raftmq.broker.txn_apply import MAX_TXN_ID_BYTES, TxnApplier, parse_end_detail
from raftmq.broker.txn_records import (
    HALF_PRODUCER_ID,
    PROP_CHECK_IMMUNITY,
    PROP_PRODUCER_GROUP,
    PROP_TRAN_MSG,
    PROP_TRANSACTION_CLIENT,
    PROP_TRANSACTION_ID,
    TxnCheck,
    TxnEnd,
    TxnMoved,
    encode_txn,
)
from raftmq.common.errors import (
    InternalError,
    InvalidArgumentError,
    RaftMQError,
    TransactionConflictError,
    TransactionNotFoundError,
)
from raftmq.common.message import Message, encode_msg_id, validate_group, validate_topic
from raftmq.common.pb import transaction_pb2
from raftmq.common.record_batch import ProducerSequence

log = logging.getLogger("broker.transactions")

RESOLUTION_FROM_PB = {
    transaction_pb2.COMMIT: Resolution.COMMIT,
    transaction_pb2.ROLLBACK: Resolution.ROLLBACK,
    transaction_pb2.UNKNOWN: Resolution.UNKNOWN,
}
MAX_PENDING_PER_CLIENT = 1024  # checks waiting for one producer's poll; older ones dropped
MAX_CHECKS_PER_POLL = 256
CHECK_BATCH = 64  # checks and moves proposed per tick
MIN_POLL_EXPIRY_S = 3.0  # a producer not polling for this long is no longer a live member
MAX_CLIENTS = 100_000


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _validate_ids(txn_id: str, group: str) -> None:
    if not txn_id or not txn_id.isprintable() or len(txn_id.encode()) > MAX_TXN_ID_BYTES:
        raise InvalidArgumentError(
            f"transaction id {txn_id[:60]!r} must be printable text of 1..{MAX_TXN_ID_BYTES} "
            "bytes (the id SendHalfMessage stored)"
        )
    validate_group(group)


@dataclass(slots=True)
class _Client:
    last_seen: float
    polls: int = 0  # polls held right now: a client holding one is live, however long it waits
    pending: collections.deque[transaction_pb2.TransactionCheck] = field(
        default_factory=lambda: collections.deque(maxlen=MAX_PENDING_PER_CLIENT)
    )


@dataclass(frozen=True, slots=True)
class PreparedHalf:
    payload: bytearray
    queue_id: int
    timeout_s: float


class ProducerChecks:
    """Leader-local: each live producer (group, client) by its last poll, and the checks waiting
    for its next poll. Bounded: clients, checks per client."""

    def __init__(self, expiry_s: float) -> None:
        self.expiry_s = expiry_s
        self._cond = threading.Condition()
        self._clients: dict[tuple[str, str], _Client] = {}

    def seen(self, group: str, client: str, now: float) -> bool:
        """Record a poll; True if the client was not known (a new live member)."""
        with self._cond:
            c = self._clients.get((group, client))
            if c is not None:
                c.last_seen = now
                return False
            if len(self._clients) >= MAX_CLIENTS:
                raise InvalidArgumentError(f"more than {MAX_CLIENTS} transactional producers")
            self._clients[group, client] = _Client(now)
            return True

    def push(self, group: str, client: str, check: transaction_pb2.TransactionCheck) -> None:
        with self._cond:
            c = self._clients.get((group, client))
            if c is None:
                return  # gone meanwhile: the next check goes to another member
            c.pending.append(check)
            self._cond.notify_all()

    def wait(
        self, group: str, client: str, deadline: float, max_n: int
    ) -> list[transaction_pb2.TransactionCheck]:
        """The client's waiting checks, at most max_n, as soon as there are any (or [] at the
        deadline); the client counts as live while it waits."""
        with self._cond:
            held = self._clients.get((group, client))
            if held is not None:
                held.polls += 1
            try:
                while True:
                    c = self._clients.get((group, client))
                    if c is None:
                        return []  # cleared: no longer leading
                    if c.pending:
                        n = min(max_n, len(c.pending))
                        return [c.pending.popleft() for _ in range(n)]
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return []
                    self._cond.wait(left)
            finally:
                c = self._clients.get((group, client))
                if c is not None and c is held:
                    c.polls -= 1
                    c.last_seen = time.monotonic()

    def expire(self, now: float) -> list[tuple[str, str]]:
        """Clients whose last poll is older than expiry_s (no poll is held either)."""
        with self._cond:
            gone = [
                k
                for k, c in self._clients.items()
                if c.polls == 0 and now - c.last_seen > self.expiry_s
            ]
            for k in gone:
                del self._clients[k]
            return gone

    def clear(self) -> None:
        with self._cond:
            self._clients.clear()
            self._cond.notify_all()


class TransactionShell:
    """Build it with the node and the applier its dispatcher runs; start() the check loop."""

    def __init__(self, node: BrokerNode, applier: TxnApplier) -> None:
        self.node = node
        self.applier = applier
        s = node.settings
        self._timeout_s = s.send_timeout_ms / 1000
        shortest = min(s.transaction_timeout_ms, s.transaction_check_interval_ms) / 1000
        self.tick_s = min(1.0, max(0.05, shortest / 5))
        self.checks = ProducerChecks(max(MIN_POLL_EXPIRY_S, 2 * self.tick_s))
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"txn-check-{node.me.node_id}", daemon=True
        )
        self._leading = False
        self.moved = 0  # half messages moved by this node as leader (for tests and status)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.checks.clear()
        if self._thread.is_alive():
            self._thread.join(5.0)

    # ---- requests -----------------------------------------------------------------------------

    def send_half(
        self, req: transaction_pb2.SendHalfMessageRequest
    ) -> transaction_pb2.SendHalfMessageResponse:
        """The whole half send, blocking the calling thread through replication."""
        prepared = self.prepare_half(req)
        return self.half_answer(
            prepared, self.node.replicate([prepared.payload], prepared.timeout_s)[0]
        )

    def half_needs_thread(self, req: transaction_pb2.SendHalfMessageRequest) -> bool:
        return self.node.sends.needs_thread(req.topic)

    def prepare_half(self, req: transaction_pb2.SendHalfMessageRequest) -> PreparedHalf:
        """Everything checked and decided before replication (may block: see half_needs_thread)."""
        _validate_ids(req.transaction_id, req.producer_group)
        if not req.client_id or not req.client_id.isprintable() or len(req.client_id) > 256:
            raise InvalidArgumentError("client_id must be printable text of 1..256 characters")
        if req.check_immunity_ms < 0:
            raise InvalidArgumentError(f"check_immunity_ms {req.check_immunity_ms} is negative")
        validate_topic(req.topic)  # a user topic: no half messages into system topics
        user = message_from_pb(req.topic, req.message)
        # Validated as any send (reserved property names refused), gated, queue chosen.
        prepared = self.node.sends.prepare(req.topic, req.queue_id, [user], "", 0, req.timeout_ms)
        props = dict(user.properties)
        props[PROP_TRAN_MSG] = "true"
        props[PROP_PRODUCER_GROUP] = req.producer_group
        props[PROP_TRANSACTION_ID] = req.transaction_id
        props[PROP_TRANSACTION_CLIENT] = req.client_id
        if req.check_immunity_ms:
            props[PROP_CHECK_IMMUNITY] = str(-(-req.check_immunity_ms // 1000))
        half = Message(
            user.topic,
            user.body,
            user.tags,
            user.keys,
            props,
            user.flag,
            user.born_timestamp_ms,
            user.born_host,
        )
        # A v2 stored batch as any send; the mark producer id (no client may send one) is
        # what the dispatcher tells a half by.
        payload = encode_stored(
            req.topic,
            prepared.queue_id,
            (half,),
            ProducerSequence(HALF_PRODUCER_ID, 0),
            _now_ms(),
            self.node.batch_version(),
        )
        return PreparedHalf(payload, prepared.queue_id, prepared.timeout_s)

    def half_answer(
        self, prepared: PreparedHalf, outcome: ChunkOutcome
    ) -> transaction_pb2.SendHalfMessageResponse:
        group = self.node.group
        if isinstance(outcome, Appended):
            s = outcome.stored
            return transaction_pb2.SendHalfMessageResponse(
                msg_id=encode_msg_id(group, s.raft_index, s.slot, 0),
                queue_id=prepared.queue_id,
                broker_group=group,
            )
        if isinstance(outcome, Duplicate):
            return transaction_pb2.SendHalfMessageResponse(
                queue_id=prepared.queue_id, broker_group=group, duplicate=True
            )
        if isinstance(outcome, Rejected):
            raise InvalidArgumentError(f"half message refused by {group}: {outcome.reason}")
        raise InternalError(f"unexpected outcome {outcome!r} for a half message")

    def end(
        self, req: transaction_pb2.EndTransactionRequest
    ) -> transaction_pb2.EndTransactionResponse:
        """The whole end, blocking the calling thread through replication."""
        prepared = self.prepare_end(req)
        if isinstance(prepared, transaction_pb2.EndTransactionResponse):
            return prepared
        outcome = self.node.replicate([prepared], self._timeout_s)[0]
        return self.end_answer(req, outcome)

    def end_needs_thread(self) -> bool:
        return not self.node.leader_gate_open()

    @property
    def end_timeout_s(self) -> float:
        return self._timeout_s

    def prepare_end(
        self, req: transaction_pb2.EndTransactionRequest
    ) -> bytes | transaction_pb2.EndTransactionResponse:
        """The entry to replicate, or the answer when none is needed (typed errors raised)."""
        _validate_ids(req.transaction_id, req.producer_group)
        resolution = RESOLUTION_FROM_PB.get(req.resolution)
        if resolution is None:
            raise InvalidArgumentError("resolution must be COMMIT, ROLLBACK or UNKNOWN")
        self.node.require_leader()
        with self.applier.lock:
            txn = self.applier.book.get(req.transaction_id)
            if txn is not None and txn.producer_group != req.producer_group:
                raise InvalidArgumentError(
                    f"transaction {req.transaction_id!r} belongs to producer group "
                    f"{txn.producer_group!r}, not {req.producer_group!r}"
                )
            self.applier.book.validate_end(req.transaction_id, resolution)
            if resolution is Resolution.UNKNOWN and txn is not None:
                # UNKNOWN changes nothing: no entry; the next check stays scheduled.
                return transaction_pb2.EndTransactionResponse(state=txn.state.value)
        return encode_txn(TxnEnd(req.transaction_id, resolution, _now_ms(), req.from_check))

    @staticmethod
    def end_answer(
        req: transaction_pb2.EndTransactionRequest, outcome: ChunkOutcome
    ) -> transaction_pb2.EndTransactionResponse:
        txn_id, resolution = req.transaction_id, RESOLUTION_FROM_PB[req.resolution]
        if not isinstance(outcome, Applied):
            raise InternalError(f"unexpected outcome {outcome!r} for a transaction end")
        result, state = parse_end_detail(outcome.detail)
        if result is EndOutcome.NOT_FOUND:
            raise TransactionNotFoundError.for_id(txn_id)
        if result is EndOutcome.CONFLICT:
            assert state is not None
            verb = "committed" if resolution is Resolution.COMMIT else "rolled back"
            raise TransactionConflictError.for_end(txn_id, state.value, verb)
        return transaction_pb2.EndTransactionResponse(
            state=(state or TxnState.HALF).value, already=result is EndOutcome.ALREADY
        )

    def poll(
        self, req: transaction_pb2.PollTransactionChecksRequest, deadline: float
    ) -> transaction_pb2.PollTransactionChecksResponse:
        validate_group(req.producer_group)
        if not req.client_id or not req.client_id.isprintable() or len(req.client_id) > 256:
            raise InvalidArgumentError("client_id must be printable text of 1..256 characters")
        self.node.require_leader()
        group, client = req.producer_group, req.client_id
        now = time.monotonic()
        if self.checks.seen(group, client, now):
            log.info("broker.transaction_producer_up group=%s client=%s", group, client)
        with self.applier.lock:
            self.applier.book.producer_up(group, client)
        wait_s = min(max(req.max_wait_ms, 0), self.node.settings.long_poll_max_ms) / 1000
        max_n = min(req.max_checks or 32, MAX_CHECKS_PER_POLL)
        got = self.checks.wait(group, client, min(deadline, now + wait_s), max_n)
        return transaction_pb2.PollTransactionChecksResponse(checks=got)

    # ---- the leader's check loop --------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.wait(self.tick_s):
            try:
                self._tick()
            except Exception:
                log.exception("broker.transaction_check_failed")

    def _tick(self) -> None:
        node = self.node
        if node.closed or not node.rlog.is_leader():
            if self._leading:
                self._leading = False
                with self.applier.lock:
                    self.applier.book.lost_leadership()
                self.checks.clear()
            return
        try:
            node.require_leader()  # opens this term's latch: the book has every earlier entry
        except RaftMQError:
            return
        self._leading = True
        for group, client in self.checks.expire(time.monotonic()):
            log.info("broker.transaction_producer_down group=%s client=%s", group, client)
            with self.applier.lock:
                self.applier.book.producer_down(group, client)
        now = _now_ms()
        with self.applier.lock:
            actions = self.applier.book.due_checks(now, CHECK_BATCH)
        if not actions:
            return
        payloads = [
            encode_txn(
                TxnCheck(a.txn_id, now, a.client)
                if isinstance(a, CheckAction)
                else TxnMoved(a.txn_id, now)
            )
            for a in actions
        ]
        try:
            outcomes = node.replicate(payloads, self._timeout_s)
        except RaftMQError as exc:
            log.info("broker.transaction_check_not_committed error=%s", exc)
            with self.applier.lock:
                self.applier.book.proposal_failed(a.txn_id for a in actions)
            return
        for action, outcome in zip(actions, outcomes, strict=True):
            if not isinstance(outcome, Applied):
                continue
            if isinstance(action, MoveAction):
                if outcome.detail == "moved":
                    self.moved += 1
                    log.warning(
                        "broker.transaction_moved txn=%s topic=%s queue=%d checks=%d: no "
                        "producer resolved it; the half message is in TRANS_CHECK_MAX_TIME_TOPIC",
                        action.txn_id,
                        action.ref.topic,
                        action.ref.queue_id,
                        action.checks,
                    )
            elif outcome.detail == "sent" and action.client is not None:
                self._deliver(action)

    def _deliver(self, action: CheckAction) -> None:
        row = self.applier.half_row(action.txn_id)
        with self.applier.lock:
            txn = self.applier.book.get(action.txn_id)
            times = txn.checks if txn is not None else 0
        if row is None or txn is None or action.client is None:
            return
        try:
            stored = self.node.reader.read([row])[0]
        except Exception as exc:  # the check is still counted; the next one tries again
            log.warning("broker.transaction_check_unreadable txn=%s error=%s", action.txn_id, exc)
            return
        check = transaction_pb2.TransactionCheck(
            transaction_id=action.txn_id,
            producer_group=action.producer_group,
            message=stored_to_pb(stored),
            check_times=times,
        )
        log.info(
            "broker.transaction_check txn=%s group=%s client=%s times=%d",
            action.txn_id,
            action.producer_group,
            action.client,
            times,
        )
        self.checks.push(action.producer_group, action.client, check)
