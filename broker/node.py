"""BrokerNode: one node of a broker group. Ties the replicated log (the CommitLog), the
dispatcher and the message store together and implements every broker operation on values.

No gRPC here (broker/service.py converts); errors are client.errors types, each saying whose
fault it is. Only the leader writes (invariant 6); a send is answered after its entry is
committed on a majority and dispatched, so the answer carries the queue offsets every replica has.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field

from raftmq.broker.dispatcher_thread import DispatcherThread, DispatchProgress
from raftmq.broker.errors import DispatcherStoppedError, StoreError, StoreFullError
from raftmq.broker.outcomes import OutcomeBook
from raftmq.broker.rows import Appended, Applied, ChunkOutcome, CQRow, Duplicate, Rejected
from raftmq.broker.settings import BrokerSettings
from raftmq.broker.store import MessageReader, MessageStore, RawPart
from raftmq.common import record_batch
from raftmq.common.errors import (
    BrokerUnavailableError,
    InternalError,
    InvalidArgumentError,
    MessageNotFoundError,
    MessageTooLargeError,
    NotLeaderError,
    OffsetOutOfRangeError,
    OutcomeUnknownError,
    PermissionDeniedError,
    QueueFullError,
    RaftMQError,
    TopicAlreadyExistsError,
    TopicNotFoundError,
)
from raftmq.common.filter.sql92 import Filter, FilterSyntaxError, compile_filter
from raftmq.common.filter.tag import parse_tag_expression
from raftmq.common.message import (
    Message,
    MessageLimits,
    StoredMessage,
    decode_msg_id,
    encode_msg_id,
    is_system_topic,
    validate_group,
    validate_message,
    validate_producer_id,
    validate_topic,
)
from raftmq.common.record_batch import (
    CommitOffset,
    ProduceBatch,
    ProducerSequence,
    ResetOffsets,
    TopicConfigChange,
    TopicOp,
)
from raftmq.common.topic_config import TopicConfig, validate_topic_config
from raftmq.common.types import Member
from raftmq.raftlog import errors as rl_errors
from raftmq.raftlog.log import ReplicatedLog
from raftmq.raftlog.record import Committed, LogStatus, Role, RoleChange

log = logging.getLogger("broker.node")

LEADER_READY_WAIT_S = 2.0  # a new leader applies its no-op first; hold writes that long at most
SCAN_ROWS_PER_PULL = 16_000  # rows a filtered pull may skip before answering NO_MATCHED_MSG
DISPATCH_CATCHUP_S = 1.0  # a pull past a queue's end waits this long for this node's indexing


class PullStatus:
    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"
    NO_MATCHED_MSG = "NO_MATCHED_MSG"


@dataclass(frozen=True, slots=True)
class SendOutcome:
    msg_id: str  # "" for a duplicate whose original is no longer remembered
    queue_id: int
    queue_offset: int  # -1 when unknown (see msg_id)
    duplicate: bool


@dataclass(frozen=True, slots=True)
class PullResult:
    status: str
    messages: list[StoredMessage]
    next_offset: int
    min_offset: int
    max_offset: int
    raw_parts: list[RawPart] = field(default_factory=list)  # instead of messages, when asked


@dataclass(frozen=True, slots=True)
class QueueInfo:
    queue_id: int
    min_offset: int
    max_offset: int
    min_store_timestamp_ms: int  # 0 = empty
    max_store_timestamp_ms: int  # 0 = empty


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class BrokerNode:
    """Create from the main thread (pysyncobj's tick thread lives as long as its creator), then
    start(); close() hands leadership off and stops everything."""

    def __init__(self, settings: BrokerSettings) -> None:
        self.settings = settings
        self.me: Member = settings.me
        self.group = settings.broker_group
        self.members = settings.member_list
        self._by_raft = {m.raft_address: m for m in self.members}
        self.limits = MessageLimits(max_message_bytes=settings.max_message_bytes)
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        self.store = MessageStore(
            settings.data_dir / "store", map_size_bytes=settings.store_map_size_bytes
        )
        self._role_listeners: list[Callable[[RoleChange], None]] = []
        self._topic_listeners: list[Callable[[], None]] = []
        self.outcomes = OutcomeBook(self.store.dispatched_index)
        self.rlog = ReplicatedLog(settings.raft_config(), on_role_change=self._on_role_change)
        self.dispatcher = DispatcherThread(
            self.rlog, self.store, on_progress=self._on_progress, name=f"dispatch-{self.me.node_id}"
        )
        self.reader = MessageReader(self.group, self.rlog.read)
        self._queue_rr = itertools.count()
        self._closed = False

    # ---- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        self.dispatcher.start()

    def close(self) -> None:
        """Hand leadership off (writers see no error), then stop the log, dispatcher, store."""
        if self._closed:
            return
        self._closed = True
        self.rlog.close(transfer_leadership=True)
        self.dispatcher.stop()
        self.store.close()

    def add_role_listener(self, listener: Callable[[RoleChange], None]) -> None:
        self._role_listeners.append(listener)

    def add_topic_listener(self, listener: Callable[[], None]) -> None:
        """Called (on the dispatcher thread) after topic configuration changed."""
        self._topic_listeners.append(listener)

    def _on_role_change(self, change: RoleChange) -> None:
        log.info(
            "broker.role_change node=%s role=%s term=%d leader=%s",
            self.me.node_id,
            change.role.value,
            change.term,
            change.leader,
        )
        for listener in list(self._role_listeners):
            try:
                listener(change)
            except Exception:
                log.exception("broker.role_listener_failed")

    def _on_progress(self, progress: DispatchProgress) -> None:
        self.outcomes.record(progress)
        if any(out.topic_rows for out in progress.outputs):
            for listener in list(self._topic_listeners):
                try:
                    listener()
                except Exception:
                    log.exception("broker.topic_listener_failed")

    # ---- leadership ---------------------------------------------------------------------------

    def member_for_raft(self, raft_address: str | None) -> Member | None:
        return self._by_raft.get(raft_address) if raft_address else None

    def leader(self) -> Member | None:
        st = self.rlog.status()
        if st.role is Role.LEADER:
            return self.me
        return self.member_for_raft(st.leader)

    def _not_leader(self) -> NotLeaderError:
        leader = self.leader()
        hint = leader.address if leader is not None and leader is not self.me else ""
        return NotLeaderError.for_node(self.me.node_id, self.group, hint)

    def _require_leader(self) -> None:
        """Writes only on a leader whose no-op is applied and dispatched, so the topic table and
        the producer sequences it checks against include every earlier entry."""
        deadline = time.monotonic() + LEADER_READY_WAIT_S
        while True:
            if self._closed:
                raise BrokerUnavailableError(f"node {self.me.node_id} is shutting down")
            if not self.rlog.is_leader():
                raise self._not_leader()
            if self.rlog.is_leader_ready():
                committed = self.rlog.committed_index
                if self.dispatcher.dispatched_index >= committed:
                    return
                left = deadline - time.monotonic()
                if left > 0 and self._wait_dispatched(committed, left):
                    return
            if time.monotonic() >= deadline:
                raise NotLeaderError.for_node(self.me.node_id, self.group, "")
            time.sleep(0.005)

    def _wait_dispatched(self, index: int, timeout_s: float) -> bool:
        try:
            return self.dispatcher.wait_dispatched(index, timeout_s)
        except DispatcherStoppedError as exc:
            raise self._dispatcher_down(exc) from exc

    def _dispatcher_down(self, exc: BaseException) -> RaftMQError:
        if self._closed:
            return BrokerUnavailableError(f"node {self.me.node_id} is shutting down")
        failure = self.dispatcher.failure
        if isinstance(failure, StoreFullError):
            return BrokerUnavailableError(
                f"node {self.me.node_id}'s index store is full ({failure}); raise "
                "store_map_size_bytes and restart it"
            )
        return InternalError(f"node {self.me.node_id}'s dispatcher stopped: {failure or exc}")

    def transfer_leadership(self, target_node_id: str, timeout_s: float) -> bool:
        if not self.rlog.is_leader():
            raise self._not_leader()
        target: str | None = None
        if target_node_id:
            member = next((m for m in self.members if m.node_id == target_node_id), None)
            if member is None:
                raise InvalidArgumentError(
                    f"node {target_node_id!r} is not a member of {self.group} "
                    f"({', '.join(m.node_id for m in self.members)})"
                )
            target = member.raft_address
        return self.rlog.transfer_leadership(target, timeout_s=timeout_s)

    def status(self) -> LogStatus:
        return self.rlog.status()

    # ---- replication --------------------------------------------------------------------------

    def _submit(self, payload: bytes) -> Future[Committed]:
        try:
            return self.rlog.submit(payload)
        except rl_errors.EntryTooLargeError as exc:
            raise MessageTooLargeError(
                f"the request encodes to {exc.size_bytes} bytes; one request may carry at most "
                f"{exc.max_bytes}: send fewer or smaller messages per batch",
                details={"size_bytes": str(exc.size_bytes), "max_bytes": str(exc.max_bytes)},
            ) from exc
        except rl_errors.LogClosedError as exc:
            raise BrokerUnavailableError(f"node {self.me.node_id} is shutting down") from exc

    def _await_commit(self, fut: Future[Committed], deadline: float) -> Committed:
        try:
            return fut.result(timeout=max(0.0, deadline - time.monotonic()))
        except FutureTimeout as exc:
            raise OutcomeUnknownError(
                f"not committed within {self.settings.send_timeout_ms} ms on broker group "
                f"{self.group}; it may still be: retry with the same producer sequence"
            ) from exc
        except rl_errors.NotLeaderError as exc:
            raise self._not_leader() from exc
        except rl_errors.QueueFullError as exc:
            raise QueueFullError(f"broker group {self.group}: {exc}") from exc
        except rl_errors.OutcomeUnknownError as exc:
            raise OutcomeUnknownError(
                f"broker group {self.group} lost leadership before the commit was known ({exc}); "
                "retry with the same producer sequence on the new leader"
            ) from exc
        except rl_errors.LogClosedError as exc:
            raise BrokerUnavailableError(f"node {self.me.node_id} is shutting down") from exc

    def _replicate(self, payloads: Sequence[bytes], timeout_s: float) -> list[ChunkOutcome]:
        """Submit chunks, wait for their commit and dispatch; the dispatcher's verdict of each."""
        deadline = time.monotonic() + timeout_s
        futures = [self._submit(p) for p in payloads]
        committed = [self._await_commit(f, deadline) for f in futures]
        outcomes: list[ChunkOutcome] = []
        for c in committed:
            try:
                outcome = self.outcomes.wait(
                    c.index, c.slot, max(0.05, deadline - time.monotonic())
                )
            except Exception as exc:
                raise self._dispatcher_down(exc) from exc
            if outcome is None:
                if self.dispatcher.failure is not None or not self.dispatcher.running:
                    raise self._dispatcher_down(DispatcherStoppedError("stopped"))
                raise OutcomeUnknownError(
                    f"entry {c.index} is committed but not yet indexed on {self.me.node_id}; "
                    "retry with the same producer sequence"
                )
            outcomes.append(outcome)
        return outcomes

    # ---- topics -------------------------------------------------------------------------------

    def topic(self, name: str) -> TopicConfig | None:
        return self.store.topic(name)

    def topics(self) -> list[TopicConfig]:
        return self.store.topics()

    def _topic_for_write(self, name: str) -> TopicConfig:
        cfg = self.store.topic(name)
        if cfg is not None:
            return cfg
        if not self.settings.auto_create_topic and not is_system_topic(name):
            raise TopicNotFoundError.for_topic(name, auto_create=False)
        n = self.settings.default_queue_nums
        created = TopicConfig(name, n, n, auto_created=True)
        self._change_topic(TopicOp.CREATE, created)
        cfg = self.store.topic(name)
        if cfg is None:  # deleted again in between
            raise TopicNotFoundError.for_topic(name, auto_create=True)
        log.info("broker.topic_auto_created topic=%s queues=%d", name, n)
        return cfg

    def _change_topic(self, op: TopicOp, cfg: TopicConfig) -> str:
        outcome = self._replicate(
            [record_batch.encode(TopicConfigChange(op, cfg))], self.settings.send_timeout_ms / 1000
        )[0]
        if isinstance(outcome, Rejected):
            raise InvalidArgumentError(f"topic change refused: {outcome.reason}")
        return outcome.detail if isinstance(outcome, Applied) else ""

    def create_topic(self, cfg: TopicConfig) -> TopicConfig:
        self._check_topic_config(cfg)
        self._require_leader()
        existing = self.store.topic(cfg.name)
        if existing is not None:
            if _same_topic(existing, cfg):
                return existing
            raise TopicAlreadyExistsError.for_topic(cfg.name)
        self._change_topic(TopicOp.CREATE, cfg)
        return self._topic_or_missing(cfg.name)

    def update_topic(self, cfg: TopicConfig) -> TopicConfig:
        self._check_topic_config(cfg)
        self._require_leader()
        if self.store.topic(cfg.name) is None:
            raise TopicNotFoundError.for_topic(cfg.name, auto_create=True)
        self._change_topic(TopicOp.UPDATE, cfg)
        return self._topic_or_missing(cfg.name)

    def delete_topic(self, name: str) -> None:
        validate_topic(name, allow_system=True)
        self._require_leader()
        if self.store.topic(name) is None:
            raise TopicNotFoundError.for_topic(name, auto_create=True)
        self._change_topic(TopicOp.DELETE, TopicConfig(name))

    def _topic_or_missing(self, name: str) -> TopicConfig:
        cfg = self.store.topic(name)
        if cfg is None:
            raise TopicNotFoundError.for_topic(name, auto_create=True)
        return cfg

    @staticmethod
    def _check_topic_config(cfg: TopicConfig) -> None:
        validate_topic(cfg.name, allow_system=False)
        validate_topic_config(cfg)

    def _readable_topic(self, name: str, queue_id: int) -> TopicConfig:
        validate_topic(name, allow_system=True)
        cfg = self.store.topic(name)
        if cfg is None:
            raise TopicNotFoundError.for_topic(name, auto_create=True)
        if not cfg.readable:
            raise PermissionDeniedError.for_topic(name, "read", str(cfg.perm))
        if queue_id >= 0 and queue_id >= cfg.read_queue_nums:
            raise InvalidArgumentError(
                f"queue {queue_id} does not exist: topic {name!r} has {cfg.read_queue_nums} "
                f"read queues on {self.group}"
            )
        if queue_id < -1:
            raise InvalidArgumentError(f"queue id {queue_id} is negative")
        return cfg

    # ---- produce ------------------------------------------------------------------------------

    def send(
        self,
        topic: str,
        queue_id: int,
        messages: Sequence[Message],
        producer_id: str,
        first_sequence: int,
        timeout_ms: int,
    ) -> tuple[int, list[SendOutcome]]:
        """Store `messages` in one queue (-1: the broker picks one). Returns (the queue id used,
        one outcome per message). A retried producer sequence is answered with the original."""
        validate_topic(topic, allow_system=True)
        if not messages:
            raise InvalidArgumentError("a send request must carry at least one message")
        if len(messages) > self.settings.max_batch_messages:
            raise InvalidArgumentError(
                f"{len(messages)} messages in one request; the limit is "
                f"{self.settings.max_batch_messages} (max_batch_messages)"
            )
        for m in messages:
            if len(m.body) > self.limits.max_message_bytes:
                raise MessageTooLargeError.for_size(len(m.body), self.limits.max_message_bytes)
            validate_message(m, self.limits, allow_system_topic=True)
        producer: ProducerSequence | None = None
        if producer_id:
            validate_producer_id(producer_id)
            if first_sequence < 0:
                raise InvalidArgumentError(f"first_sequence {first_sequence} is negative")
            producer = ProducerSequence(producer_id, first_sequence)
        self._require_leader()
        cfg = self._topic_for_write(topic)
        if not cfg.writable:
            raise PermissionDeniedError.for_topic(topic, "write", str(cfg.perm))
        if queue_id == -1:
            if producer is not None:
                raise InvalidArgumentError(
                    "an idempotent send (producer_id set) must name its queue: the sequence "
                    "is kept per queue"
                )
            queue_id = next(self._queue_rr) % cfg.write_queue_nums
        elif not 0 <= queue_id < cfg.write_queue_nums:
            raise InvalidArgumentError(
                f"queue {queue_id} does not exist: topic {topic!r} has {cfg.write_queue_nums} "
                f"write queues on {self.group}"
            )
        batch = ProduceBatch(topic, queue_id, _now_ms(), tuple(messages), producer)
        try:
            payload = record_batch.encode(batch)
        except ValueError as exc:
            raise InvalidArgumentError(f"cannot encode the messages: {exc}") from exc
        timeout_s = (timeout_ms or self.settings.send_timeout_ms) / 1000
        if self.settings.debug_ack_before_commit:
            # The bug the chaos checker must catch: acknowledged before a majority has it.
            self._submit(payload)
            return queue_id, [SendOutcome("", queue_id, -1, False) for _ in messages]
        outcome = self._replicate([payload], min(timeout_s, self.settings.send_timeout_ms / 1000))[
            0
        ]
        return queue_id, self._send_outcomes(outcome, len(messages), queue_id)

    def _send_outcomes(self, outcome: ChunkOutcome, count: int, queue_id: int) -> list[SendOutcome]:
        if isinstance(outcome, Rejected):
            raise InvalidArgumentError(
                f"send refused by broker group {self.group}: {outcome.reason}"
            )
        if isinstance(outcome, Appended):
            s = outcome.stored
            if outcome.sequence_gap is not None:
                log.info(
                    "broker.sequence_gap queue=%s/%d expected=%d received=%d",
                    outcome.topic,
                    queue_id,
                    outcome.sequence_gap.expected,
                    outcome.sequence_gap.received,
                )
            return [
                SendOutcome(
                    encode_msg_id(self.group, s.raft_index, s.slot, s.first_position + i),
                    queue_id,
                    s.first_offset + i,
                    False,
                )
                for i in range(count)
            ]
        if isinstance(outcome, Duplicate):
            s2 = outcome.stored
            if s2 is None:
                return [SendOutcome("", queue_id, -1, True) for _ in range(count)]
            return [
                SendOutcome(
                    encode_msg_id(self.group, s2.raft_index, s2.slot, s2.first_position + i),
                    queue_id,
                    s2.first_offset + i,
                    True,
                )
                for i in range(count)
            ]
        raise InternalError(f"unexpected outcome {outcome!r} for a produce batch")

    # ---- consume ------------------------------------------------------------------------------

    def _require_readable_node(self, allow_follower_read: bool) -> None:
        if self._closed:
            raise BrokerUnavailableError(f"node {self.me.node_id} is shutting down")
        if not allow_follower_read and not self.rlog.is_leader():
            raise self._not_leader()

    def pull(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int,
        *,
        sql: bool,
        expression: str,
        max_wait_ms: int,
        allow_follower_read: bool,
        max_bytes: int,
        deadline: float,
        raw: bool = False,
    ) -> PullResult:
        """Messages of one queue from `offset` on. When the queue holds nothing at `offset`, the
        request waits (long polling) until a message arrives or `max_wait_ms` passes."""
        validate_group(group)
        self._require_readable_node(allow_follower_read)
        if queue_id < 0:
            raise InvalidArgumentError(f"queue id {queue_id} is negative")
        self._readable_topic(topic, queue_id)
        try:
            sql_filter = compile_filter(expression) if sql else None
            tag_filter = None if sql else parse_tag_expression(expression or "*")
        except FilterSyntaxError as exc:
            raise InvalidArgumentError(f"filter expression {expression!r}: {exc}") from exc
        hashes = tag_filter.hash_codes if tag_filter is not None else None
        max_count = min(max(max_count, 1), self.settings.pull_max_messages)
        max_bytes = min(max_bytes or self.settings.pull_max_bytes, self.settings.pull_max_bytes)
        wait_s = min(max(max_wait_ms, 0), self.settings.long_poll_max_ms) / 1000
        deadline = min(deadline, time.monotonic() + wait_s)
        caught_up = False
        while True:
            low, high = self.store.queue_bounds(topic, queue_id)
            if offset < low or offset > high:
                committed = self.rlog.committed_index
                if not caught_up and past_end_may_be_unindexed(
                    offset, high, self.dispatcher.dispatched_index, committed
                ):
                    caught_up = True
                    self._wait_dispatched(committed, DISPATCH_CATCHUP_S)
                    continue
                raise OffsetOutOfRangeError.for_offset(topic, queue_id, offset, low, high)
            if offset == high:
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    return PullResult(PullStatus.NO_NEW_MSG, [], offset, low, high)
                try:
                    self.dispatcher.wait_for_message(topic, queue_id, offset, min(left, 1.0))
                except DispatcherStoppedError as exc:
                    raise self._dispatcher_down(exc) from exc
                continue
            scan = self.store.scan_queue(
                topic, queue_id, offset, max_count, hashes, max_scan_rows=SCAN_ROWS_PER_PULL
            )
            if raw:
                keep = _sql_keep(sql_filter) if sql_filter is not None else None
                try:
                    parts, cut_at = self.reader.raw_parts(scan.rows, max_bytes, keep)
                except StoreError as exc:
                    raise InternalError(
                        f"node {self.me.node_id} cannot serve {topic}/{queue_id}: {exc}"
                    ) from exc
                next_offset = scan.next_offset if cut_at is None else cut_at
                if parts:
                    return PullResult(PullStatus.FOUND, [], next_offset, low, high, parts)
                offset = next_offset
                if offset < high or deadline - time.monotonic() <= 0:
                    return PullResult(PullStatus.NO_MATCHED_MSG, [], offset, low, high)
                continue
            rows, next_offset = _cut_by_bytes(scan.rows, max_bytes, scan.next_offset)
            try:
                messages = self.reader.read(rows) if rows else []
            except StoreError as exc:
                raise InternalError(
                    f"node {self.me.node_id} cannot serve {topic}/{queue_id}: {exc}"
                ) from exc
            if sql_filter is not None:
                messages = [
                    m for m in messages if sql_filter.matches(m.message.properties, m.message.tags)
                ]
            if messages:
                return PullResult(PullStatus.FOUND, messages, next_offset, low, high)
            offset = next_offset
            if offset < high or deadline - time.monotonic() <= 0:
                return PullResult(PullStatus.NO_MATCHED_MSG, [], offset, low, high)

    # ---- offsets ------------------------------------------------------------------------------

    def commit_offsets(self, group: str, offsets: Sequence[tuple[str, int, int]]) -> None:
        validate_group(group)
        if not offsets:
            return
        if len(offsets) > 4096:
            raise InvalidArgumentError(f"{len(offsets)} offsets in one commit; the limit is 4096")
        for topic, queue_id, offset in offsets:
            validate_topic(topic, allow_system=True)
            if queue_id < 0 or offset < 0:
                raise InvalidArgumentError(
                    f"offset {offset} of {topic}/{queue_id}: queue id and offset must be >= 0"
                )
        self._require_leader()
        payloads = [record_batch.encode(CommitOffset(group, t, q, o)) for t, q, o in offsets]
        for outcome in self._replicate(payloads, self.settings.send_timeout_ms / 1000):
            if isinstance(outcome, Rejected):
                raise InvalidArgumentError(f"offset commit refused: {outcome.reason}")

    def query_offset(self, group: str, topic: str, queue_id: int) -> int:
        validate_group(group)
        validate_topic(topic, allow_system=True)
        found = self.store.committed_offset(group, topic, queue_id)
        return -1 if found is None else found

    def queue_info(self, topic: str, queue_id: int) -> QueueInfo:
        self._readable_topic(topic, queue_id)
        low, high = self.store.queue_bounds(topic, queue_id)
        first_ts = last_ts = 0
        if high > low:
            first = self.store.read_queue(topic, queue_id, low, 1)
            last = self.store.read_queue(topic, queue_id, high - 1, 1)
            first_ts = first[0].store_timestamp_ms if first else 0
            last_ts = last[0].store_timestamp_ms if last else 0
        return QueueInfo(queue_id, low, high, first_ts, last_ts)

    def offset_for_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        self._readable_topic(topic, queue_id)
        return self.store.offset_for_timestamp(topic, queue_id, timestamp_ms)

    def reset_offsets_to_timestamp(
        self, group: str, topic: str, timestamp_ms: int
    ) -> dict[int, int]:
        """RocketMQ's message backtracking: every queue of `topic` on this group goes to the first
        offset stored at or after `timestamp_ms`."""
        validate_group(group)
        cfg = self._readable_topic(topic, -1)
        self._require_leader()
        offsets = {
            q: self.store.offset_for_timestamp(topic, q, timestamp_ms)
            for q in range(cfg.read_queue_nums)
        }
        outcome = self._replicate(
            [record_batch.encode(ResetOffsets(group, topic, offsets))],
            self.settings.send_timeout_ms / 1000,
        )[0]
        if isinstance(outcome, Rejected):
            raise InvalidArgumentError(f"offset reset refused: {outcome.reason}")
        return offsets

    # ---- queries ------------------------------------------------------------------------------

    def message_by_id(self, msg_id: str) -> StoredMessage:
        mid = decode_msg_id(msg_id)
        if mid.broker_group != self.group:
            raise MessageNotFoundError(
                f"message {msg_id} belongs to broker group {mid.broker_group}, not {self.group}; "
                "ask that group",
                details={"msg_id": msg_id, "broker_group": mid.broker_group},
            )
        row = self.store.cq_row_at(mid.raft_index, mid.slot, mid.position)
        if row is None:
            raise MessageNotFoundError.for_id(msg_id)
        return self._read_rows([row])[0]

    def messages_by_key(
        self, topic: str, key: str, max_count: int, begin_ms: int, end_ms: int
    ) -> list[StoredMessage]:
        self._readable_topic(topic, -1)
        if not key:
            raise InvalidArgumentError("the key to look up is empty")
        max_count = min(max(max_count, 1), self.settings.pull_max_messages)
        hits = self.store.lookup_key(
            topic, key, max_count, begin_ms=begin_ms or None, end_ms=end_ms or None
        )
        rows: list[CQRow] = []
        for hit in hits:
            rows.extend(self.store.read_queue(topic, hit.queue_id, hit.queue_offset, 1))
        return self._read_rows(rows)

    def _read_rows(self, rows: Sequence[CQRow]) -> list[StoredMessage]:
        try:
            return self.reader.read(rows)
        except StoreError as exc:
            raise InternalError(f"node {self.me.node_id} cannot read a message: {exc}") from exc


def past_end_may_be_unindexed(offset: int, high: int, dispatched: int, committed: int) -> bool:
    """A pull at `offset` beyond a queue's end (`high`, exclusive) on a node that has committed
    entries it has not indexed yet: they may hold `offset`. Another node of the group that
    indexed them first can have served the messages before it (a consumer that read from a
    follower, then returned to the leader), so this node catches up before it calls the offset
    out of range; a consumer told "out of range" resets its position (to the queue's start with
    earliest), which would redeliver the whole queue."""
    return offset > high and dispatched < committed


def _same_topic(a: TopicConfig, b: TopicConfig) -> bool:
    return (a.read_queue_nums, a.write_queue_nums, a.perm, a.ordered) == (
        b.read_queue_nums,
        b.write_queue_nums,
        b.perm,
        b.ordered,
    )


def _sql_keep(sql_filter: Filter) -> Callable[[Message], bool]:
    def keep(m: Message) -> bool:
        return sql_filter.matches(m.properties, m.tags)

    return keep


def _cut_by_bytes(rows: list[CQRow], max_bytes: int, scan_next: int) -> tuple[list[CQRow], int]:
    """Keep rows while their bodies fit in max_bytes (at least one), and where to go on."""
    total = 0
    for i, row in enumerate(rows):
        total += row.body_bytes
        if total > max_bytes and i > 0:
            return rows[:i], row.queue_offset
    return rows, scan_next
