"""SendProcessor: a send request becomes one replicated produce batch, answered from the
dispatcher's verdict (stored at these offsets, a duplicate of an earlier send, or refused).

Validates everything the caller controls before anything is replicated; picks the queue when the
caller leaves it to the broker. Never answers before the majority commit (invariant 1), except
under the chaos suite's debug_ack_before_commit self-test.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from raftmq.broker import delivery
from raftmq.broker.rows import (
    Appended,
    ChunkOutcome,
    Duplicate,
    OutOfOrder,
    Rejected,
    Scheduled,
)
from raftmq.broker.topics import TopicProcessor
from raftmq.common import stored_batch
from raftmq.common.errors import (
    InternalError,
    InvalidArgumentError,
    MessageTooLargeError,
    OutOfOrderSequenceError,
    PermissionDeniedError,
    UnsupportedError,
)
from raftmq.common.message import (
    Message,
    ValidNames,
    encode_msg_id,
    validate_message,
    validate_messages,
    validate_producer_id,
    validate_system_topic,
    validate_topic,
)
from raftmq.common.record_batch import ProducerSequence
from raftmq.common.stored_batch import BatchHeader
from raftmq.common.stored_send import BATCH_VERSION_DETAIL

if TYPE_CHECKING:
    from raftmq.broker.node import BrokerNode
    from raftmq.broker.settings import BrokerSettings

log = logging.getLogger("broker.produce")


@dataclass(frozen=True, slots=True)
class SendOutcome:
    msg_id: str  # "" for a duplicate whose original is no longer remembered
    queue_id: int
    queue_offset: int  # -1 when unknown (see msg_id)
    duplicate: bool


@dataclass(frozen=True, slots=True)
class BatchStored:
    """Where a produce batch's messages are, as a base and a count (ids are derived from
    raft_index, slot and first_position + i: common.message.encode_msg_id). A duplicate whose
    original is no longer remembered has first_offset -1."""

    queue_id: int
    first_offset: int
    count: int
    raft_index: int
    slot: int
    first_position: int
    duplicate: bool


@dataclass(frozen=True, slots=True)
class PreparedSend:
    """A checked send, ready to replicate: the queue chosen, the encoded entry, the wait."""

    queue_id: int
    # Writable: the leader's offset book places the base offset into it just before its entry
    # is proposed (broker/leader_offsets.py), and the answer at commit reads it back. A
    # memoryview: the batch in place in the request's own buffer (prepare_stored).
    payload: bytearray | memoryview
    count: int
    timeout_s: float


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class SendProcessor:
    def __init__(self, node: BrokerNode, topics: TopicProcessor) -> None:
        self._node = node
        self._topics = topics
        self._settings = node.settings
        self._queue_rr = itertools.count()
        # prepare_stored's per-batch name checks, each name once (a memo, bounded)
        self._valid_topics = ValidNames(validate_system_topic)
        self._valid_producer_ids = ValidNames(validate_producer_id)

    def send(
        self,
        topic: str,
        queue_id: int,
        messages: Sequence[Message],
        producer_id: str,
        first_sequence: int,
        timeout_ms: int,
        *,
        trusted: bool = False,
    ) -> tuple[int, list[SendOutcome]]:
        """Store `messages` in one queue (-1: the broker picks one). Returns (the queue id used,
        one outcome per message). A retried producer sequence is answered with the original."""
        prepared = self.prepare(
            topic, queue_id, messages, producer_id, first_sequence, timeout_ms, trusted=trusted
        )
        if self._settings.debug_ack_before_commit:
            return self.ack_before_commit(prepared)
        outcome = self._node.replicate([prepared.payload], prepared.timeout_s)
        return prepared.queue_id, self.outcomes(prepared, outcome[0])

    def ack_before_commit(self, prepared: PreparedSend) -> tuple[int, list[SendOutcome]]:
        """The bug the chaos checker must catch: acknowledged before a majority has it."""
        self._node.submit(prepared.payload)
        q = prepared.queue_id
        return q, [SendOutcome("", q, -1, False) for _ in range(prepared.count)]

    def outcomes(self, prepared: PreparedSend, outcome: ChunkOutcome) -> list[SendOutcome]:
        """The answer to a prepared send from its chunk's dispatched outcome."""
        return self._send_outcomes(outcome, prepared.count, prepared.queue_id)

    def needs_thread(self, topic: str) -> bool:
        """`prepare` may block (the leader gate of a new term, a topic auto-created through the
        log): an event loop runs it on a thread then, else inline."""
        return not self._node.leader_gate_open() or self._node.store.topic(topic) is None

    def prepare(
        self,
        topic: str,
        queue_id: int,
        messages: Sequence[Message],
        producer_id: str,
        first_sequence: int,
        timeout_ms: int,
        *,
        trusted: bool = False,
        strict: bool = False,
    ) -> PreparedSend:
        """Everything a send checks and decides before replication: validation, the leader gate,
        the topic (auto-created), the queue, the encoded entry. Raises the caller's errors.
        `trusted`: the broker built the messages from stored ones (a retry, a dead letter) and
        they carry reserved properties a client may not set."""
        settings = self._settings
        validate_topic(topic, allow_system=True)
        if not messages:
            raise InvalidArgumentError("a send request must carry at least one message")
        if len(messages) > settings.max_batch_messages:
            raise InvalidArgumentError(
                f"{len(messages)} messages in one request; the limit is "
                f"{settings.max_batch_messages} (max_batch_messages)"
            )
        limits = self._node.limits
        scheduled = False
        for m in messages:
            if len(m.body) > limits.max_message_bytes:
                raise MessageTooLargeError.for_size(len(m.body), limits.max_message_bytes)
            if m.properties and delivery.is_delayed(m):  # delay arguments: reserved names
                scheduled = True
        if not trusted:
            if scheduled:
                for m in messages:
                    view = delivery.user_view(m) if delivery.is_delayed(m) else m
                    validate_message(view, limits, allow_system_topic=True)
            else:  # per batch: what repeats (topic, born host) is checked once
                validate_messages(messages, limits, allow_system_topic=True)
        producer: ProducerSequence | None = None
        if producer_id:
            validate_producer_id(producer_id)
            if first_sequence < 0:
                raise InvalidArgumentError(f"first_sequence {first_sequence} is negative")
            producer = ProducerSequence(producer_id, first_sequence, strict)
        self._node.require_leader()
        self._node.check_disk_pressure()
        check_accepts_sends(self._node.settings, self._node.group)
        cfg = self._topics.topic_for_write(topic)
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
                f"write queues on {self._node.group}"
            )
        now_ms = _now_ms()
        if scheduled:  # InvalidDelayError (the caller's) before anything is replicated
            messages = delivery.stamp_due(messages, now_ms, self._node.delay_policy)
        payload = encode_stored(
            topic, queue_id, messages, producer, now_ms, self._node.batch_version(),
            scheduled=scheduled,
        )  # fmt: skip
        timeout_s = min(timeout_ms or settings.send_timeout_ms, settings.send_timeout_ms) / 1000
        return PreparedSend(queue_id, payload, len(messages), timeout_s)

    def batch_limits(self) -> stored_batch.BatchLimits:
        """What a v2 stored batch may hold here (checked before its CRC is computed)."""
        s = self._settings
        return stored_batch.BatchLimits(s.data_max_frame_bytes, s.max_batch_messages)

    def prepare_stored(
        self, header: BatchHeader, batch: memoryview, timeout_ms: int
    ) -> PreparedSend:
        """A v2 stored batch that check_batch accepted (issue 24), ready to replicate as the
        bytes it came in, with the store time stamped: the per-batch checks of `prepare` from
        its header (topic, producer id, born host, leader gate, permission, queue) and the
        message sizes. What is inside a record (utf-8 of tags, keys and properties, property
        limits, reserved names) is the producer SDK's check; readers refuse a bad record
        (docs/design.md, "Stored batch format v2"). Delayed and half messages never come here.
        A batch of a version some member of the group does not read yet is refused whole
        (UnsupportedError naming the version to send), before anything is stamped."""
        topic, queue_id, limits = header.topic, header.queue_id, self._node.limits
        if header.version > stored_batch.OLDEST_VERSION:
            check_batch_version(header.version, self._node.batch_version(), self._node.group)
        self._valid_topics.check(topic)
        if len(header.born_host.encode("utf-8")) > limits.max_born_host_bytes:
            raise InvalidArgumentError(
                f"born host of a batch exceeds {limits.max_born_host_bytes} bytes"
            )
        producer = header.producer
        if producer is not None:
            self._valid_producer_ids.check(producer.producer_id)
        if stored_batch.is_scheduled(batch):  # its due times would be the client's
            raise InvalidArgumentError(
                "a stored batch was refused: it is flagged scheduled, which only the broker "
                "writes; send delayed messages through SEND_BATCHES (the SDK's delay arguments)"
            )
        _check_sizes(batch, header, limits.max_message_bytes)
        self._node.require_leader()
        self._node.check_disk_pressure()
        check_accepts_sends(self._node.settings, self._node.group)
        cfg = self._topics.topic_for_write(topic)
        if not cfg.writable:
            raise PermissionDeniedError.for_topic(topic, "write", str(cfg.perm))
        if not 0 <= queue_id < cfg.write_queue_nums:
            raise InvalidArgumentError(
                f"queue {queue_id} does not exist: topic {topic!r} has {cfg.write_queue_nums} "
                f"write queues on {self._node.group}"
            )
        # The batch is stamped where it is when it lies in a buffer of the request's own (the
        # data server read a large request into one, common/frame.py): writable, and nothing
        # else reads it. A read-only view (a small request's copy, a gRPC message) is copied.
        payload = batch if not batch.readonly else bytearray(batch)
        # The store time now; the base offset is placed in log order, just before the entry is
        # proposed (broker/leader_offsets.py), or left to the dispatcher (slot 0).
        stored_batch.stamp(payload, 0, _now_ms())
        settings = self._settings
        timeout_s = min(timeout_ms or settings.send_timeout_ms, settings.send_timeout_ms) / 1000
        return PreparedSend(queue_id, payload, header.count, timeout_s)

    def stored(self, prepared: PreparedSend, outcome: ChunkOutcome) -> BatchStored:
        """`outcomes` per batch, not per message: the fast data path's answer (issue 14)."""
        count, queue_id = prepared.count, prepared.queue_id
        self._check_refused(outcome)
        if isinstance(outcome, Appended):
            self._log_gap(outcome, queue_id)
            s = outcome.stored
            return BatchStored(
                queue_id, s.first_offset, count, s.raft_index, s.slot, s.first_position, False
            )
        if isinstance(outcome, Scheduled):  # delayed: offsets come when due (delivery.py)
            return BatchStored(queue_id, -1, count, outcome.raft_index, outcome.slot, 0, False)
        if isinstance(outcome, Duplicate):
            s2 = outcome.stored
            if s2 is None:
                return BatchStored(queue_id, -1, count, 0, 0, 0, True)
            return BatchStored(
                queue_id, s2.first_offset, count, s2.raft_index, s2.slot, s2.first_position, True
            )
        raise InternalError(f"unexpected outcome {outcome!r} for a produce batch")

    def _check_refused(self, outcome: ChunkOutcome) -> None:
        group = self._node.group
        if isinstance(outcome, OutOfOrder):
            raise OutOfOrderSequenceError(
                f"broker group {group}: {outcome.reason}",
                details={"expected_sequence": str(outcome.expected)},
            )
        if isinstance(outcome, Rejected):
            raise InvalidArgumentError(f"send refused by broker group {group}: {outcome.reason}")

    @staticmethod
    def _log_gap(outcome: Appended, queue_id: int) -> None:
        if outcome.sequence_gap is not None:
            log.info(
                "broker.sequence_gap queue=%s/%d expected=%d received=%d",
                outcome.topic,
                queue_id,
                outcome.sequence_gap.expected,
                outcome.sequence_gap.received,
            )

    def _send_outcomes(self, outcome: ChunkOutcome, count: int, queue_id: int) -> list[SendOutcome]:
        group = self._node.group
        self._check_refused(outcome)
        if isinstance(outcome, Appended):
            s = outcome.stored
            self._log_gap(outcome, queue_id)
            return [
                SendOutcome(
                    encode_msg_id(group, s.raft_index, s.slot, s.first_position + i),
                    queue_id,
                    s.first_offset + i,
                    False,
                )
                for i in range(count)
            ]
        if isinstance(outcome, Scheduled):  # delayed: queue offsets come when they fall due
            return [
                SendOutcome(
                    encode_msg_id(group, outcome.raft_index, outcome.slot, i), queue_id, -1, False
                )
                for i in range(count)
            ]
        if isinstance(outcome, Duplicate):
            s2 = outcome.stored
            if s2 is None:
                return [SendOutcome("", queue_id, -1, True) for _ in range(count)]
            return [
                SendOutcome(
                    encode_msg_id(group, s2.raft_index, s2.slot, s2.first_position + i),
                    queue_id,
                    s2.first_offset + i if s2.first_offset >= 0 else -1,
                    True,
                )
                for i in range(count)
            ]
        raise InternalError(f"unexpected outcome {outcome!r} for a produce batch")


def check_accepts_sends(settings: BrokerSettings, group: str) -> None:
    """mqadmin's wipeWritePerm: a broker group whose write permission was taken refuses sends
    (routes already steer producers elsewhere; this answers one holding an old route)."""
    if not settings.accept_sends:
        raise PermissionDeniedError(
            f"broker group {group} does not accept sends (accept_sends=false); send to another "
            f"group, or give it back with `raftmq broker config accept_sends=true --groups "
            f"{group}`",
            details={"broker_group": group, "operation": "write"},
        )


def check_batch_version(version: int, accepted: int, group: str) -> None:
    """The mixed-version guard (docs/design.md, "Stored batch v3: compact record heads"): a
    stored batch of a version past what every member of the group reads is refused, with the
    version to send instead in the details (the SDK re-encodes its batch and sends it again)."""
    if version > accepted:
        raise UnsupportedError(
            f"broker group {group} does not accept stored batch version {version} yet: a "
            f"member of the group reads only up to version {accepted} (upgrade every member "
            f"to the same raftmq); send version {accepted}",
            details={BATCH_VERSION_DETAIL: str(accepted)},
        )


def encode_stored(
    topic: str,
    queue_id: int,
    messages: Sequence[Message],
    producer: ProducerSequence | None,
    now_ms: int,
    version: int,
    *,
    scheduled: bool = False,
) -> bytearray:
    """The broker's own write of checked messages (a send it encodes itself: older producers'
    SEND_BATCHES and SEND_MESSAGE, delayed sends, send-backs, half messages) as a stored batch
    of `version` (the group's: BrokerNode.batch_version) stamped as the SEND_STORED path stamps
    one, so the servers write one format (issue 24). The batch carries one born host: the first
    one a message names. `scheduled`: a delayed send, whose records carry the due times the
    leader stamped (delivery.stamp_due)."""
    born_host = next((m.born_host for m in messages if m.born_host), "")
    try:
        payload = bytearray(
            stored_batch.encode_batch(topic, queue_id, messages, producer, born_host, version)
        )
    except ValueError as exc:
        raise InvalidArgumentError(f"cannot encode the messages: {exc}") from exc
    if scheduled:
        stored_batch.mark_scheduled(payload)
    stored_batch.stamp(payload, 0, now_ms)  # the base offset: as a SEND_STORED batch's
    return payload


def _check_sizes(batch: memoryview, header: BatchHeader, max_body: int) -> None:
    """No message body over max_body. A batch whose whole record area fits max_body holds none
    (O(1), every W1 and batch-API batch); only a larger one has its record heads read (either
    version's, through the codec: the heads are checked against the offsets table there)."""
    if header.total_bytes - header.records_at <= max_body:
        return
    for m in stored_batch.iter_messages(batch, verify=False):
        if m.body_size > max_body:
            raise MessageTooLargeError.for_size(m.body_size, max_body)
