"""POP consumption on the broker (RocketMQ 5's pop checkpoints and ack records, kept by the
broker): the framed data path's POP_STATE, POP_RECEIVE and POP_ACK. The leader checks a request,
stamps it with its clock and replicates it as one POP_RECEIVE / POP_ACK record; the dispatcher
applies it on every replica (broker/pop_apply.py) and the answer is what the apply handed out or
acknowledged, so the proxy never tells a client about a delivery the log does not hold.

Thin: validation and protobuf mapping here, every decision in broker/pop_apply.py and
common/pop.py.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from google.protobuf.message import Message

from raftmq.broker.node import BrokerNode
from raftmq.broker.pop_apply import (
    MAX_INFLIGHT_ROW,
    Handed,
    PopAckResult,
    PopReceiveResult,
    decode_state,
)
from raftmq.broker.pull import check_consume
from raftmq.broker.rows import Applied, Rejected
from raftmq.broker.wakeups import LoopWaker
from raftmq.common import record_batch
from raftmq.common.data_api import DataMethod, parse
from raftmq.common.errors import InternalError, InvalidArgumentError
from raftmq.common.message import validate_group, validate_topic
from raftmq.common.pb import pop_pb2
from raftmq.common.pop import AckOutcome
from raftmq.common.record_batch import (
    NO_OFFSET,
    PopAck,
    PopAckEntry,
    PopQueuePart,
    PopReceive,
)
from raftmq.common.transport import Handler, RequestContext
from raftmq.common.types import MAX_QUEUE_ID

POP_METHODS = frozenset({DataMethod.POP_STATE, DataMethod.POP_RECEIVE, DataMethod.POP_ACK})
MAX_POP_QUEUES = 1024  # queues in one request (a topic rarely has more than a few dozen)
MAX_POP_OFFSETS = 4096  # offsets in one request's part, entries in one ack
MAX_INVISIBLE_MS = 7 * 24 * 3600 * 1000  # RocketMQ caps invisibility far below a week too
Blocking = Callable[..., Awaitable[Any]]

_OUTCOMES = {
    AckOutcome.DONE: pop_pb2.POP_ACK_DONE,
    AckOutcome.ALREADY: pop_pb2.POP_ACK_ALREADY,
    AckOutcome.STALE: pop_pb2.POP_ACK_STALE,
    AckOutcome.UNKNOWN: pop_pb2.POP_ACK_UNKNOWN,
}


def _check_names(group: str, topic: str) -> None:
    validate_group(group, allow_system=True)
    validate_topic(topic, allow_system=True)


def _check_queue(queue_id: int) -> None:
    if not 0 <= queue_id <= MAX_QUEUE_ID:
        raise InvalidArgumentError(
            f"queue id {queue_id} is outside 0..{MAX_QUEUE_ID}; take queue ids from the route",
            details={"argument": "queue_id"},
        )


def _check_count(n: int, limit: int, what: str) -> None:
    if n > limit:
        raise InvalidArgumentError(f"{n} {what} in one POP request; the limit is {limit}")


def _check_invisible(ms: int, *, zero_ok: bool) -> None:
    if not (0 if zero_ok else 1) <= ms <= MAX_INVISIBLE_MS:
        raise InvalidArgumentError(
            f"invisible duration {ms} ms is outside 1..{MAX_INVISIBLE_MS} ms",
            details={"argument": "invisible_ms"},
        )


def _delivery(h: Handed) -> pop_pb2.PopDelivery:
    return pop_pb2.PopDelivery(
        offset=h.offset, attempt=h.attempt, token=h.token, visible_at_ms=h.visible_at_ms
    )


def state_answer(node: BrokerNode, req: pop_pb2.PopStateRequest) -> pop_pb2.PopStateResponse:
    """The queues' POP state in this node's store (the caller passed the leader gate)."""
    _check_names(req.consumer_group, req.topic)
    _check_count(len(req.queue_ids), MAX_POP_QUEUES, "queues")
    out = pop_pb2.PopStateResponse(
        group_retry_max_times=node.store.group_config(req.consumer_group).retry_max_times
    )
    for qid in req.queue_ids:
        _check_queue(qid)
        raw = node.store.pop_state(req.consumer_group, req.topic, qid)
        q = out.queues.add(queue_id=qid, exists=raw is not None)
        if raw is None:
            continue
        p, _ = decode_state(raw)
        q.cursor, q.fifo = p.cursor, p.fifo
        for off in sorted(p.inflight):
            d = p.inflight[off]
            q.inflight.add(
                offset=d.offset, attempt=d.attempt, token=d.token, visible_at_ms=d.visible_at_ms
            )
    return out


def receive_record(req: pop_pb2.PopReceiveRequest, now_ms: int) -> bytes:
    _check_names(req.consumer_group, req.topic)
    _check_invisible(req.invisible_ms, zero_ok=False)
    _check_count(len(req.parts), MAX_POP_QUEUES, "queues")
    parts = []
    for p in req.parts:
        _check_queue(p.queue_id)
        _check_count(len(p.redeliver) + len(p.drops) + len(p.new_offsets), MAX_POP_OFFSETS,
                     "offsets")  # fmt: skip
        if p.init_offset >= NO_OFFSET or (p.pulled and p.pulled_from >= NO_OFFSET):
            raise InvalidArgumentError(f"offset out of range in the part of queue {p.queue_id}")
        parts.append(
            PopQueuePart(
                p.queue_id,
                p.init_offset,
                p.fifo,
                tuple(p.redeliver),
                tuple(p.drops),
                p.pulled_from if p.pulled else NO_OFFSET,
                p.next_offset,
                p.take,
                tuple(p.new_offsets),
                p.reset_to if p.reset and p.reset_to < NO_OFFSET else NO_OFFSET,
            )
        )
    rec = PopReceive(
        req.consumer_group,
        req.topic,
        now_ms,
        req.invisible_ms,
        min(req.max_inflight or MAX_INFLIGHT_ROW, MAX_INFLIGHT_ROW),
        tuple(parts),
    )
    return record_batch.encode(rec)


def ack_record(req: pop_pb2.PopAckRequest, now_ms: int) -> bytes:
    _check_names(req.consumer_group, req.topic)
    _check_invisible(req.invisible_ms, zero_ok=True)
    if not req.entries:
        raise InvalidArgumentError("a POP ack names at least one received message")
    _check_count(len(req.entries), MAX_POP_OFFSETS, "entries")
    for e in req.entries:
        _check_queue(e.queue_id)
    rec = PopAck(
        req.consumer_group,
        req.topic,
        now_ms,
        req.invisible_ms,
        tuple(PopAckEntry(e.queue_id, e.offset, e.token) for e in req.entries),
    )
    return record_batch.encode(rec)


def _applied(outcome: object) -> Applied:
    if isinstance(outcome, Rejected):
        raise InvalidArgumentError(f"POP request refused: {outcome.reason}")
    if not isinstance(outcome, Applied) or outcome.pop is None:
        raise InternalError(f"a POP record answered with {outcome!r}")
    return outcome


def receive_answer(outcome: object) -> pop_pb2.PopReceiveResponse:
    result = _applied(outcome).pop
    assert isinstance(result, PopReceiveResult)
    out = pop_pb2.PopReceiveResponse()
    for part in result.parts:
        out.parts.add(
            queue_id=part.queue_id,
            handed=[_delivery(h) for h in part.handed],
            cursor=part.cursor,
        )
    return out


def ack_answer(outcome: object) -> pop_pb2.PopAckResponse:
    result = _applied(outcome).pop
    assert isinstance(result, PopAckResult)
    out = pop_pb2.PopAckResponse()
    for o, d in result.outcomes:
        r = out.results.add(outcome=_OUTCOMES[o])
        if d is not None:
            r.delivery.CopyFrom(_delivery(d))
    return out


def pop_handlers(
    node: BrokerNode,
    blocking: Blocking,
    waker: LoopWaker,
    check: Callable[[RequestContext, Message], None] = lambda ctx, req: None,
) -> dict[DataMethod, Handler]:
    """The framed handlers (broker/data_server.py): a write waits for its apply as a loop
    future; only a new term's leader gate (before a read) runs on the small thread pool.
    `check` authorizes a parsed request (the DataServer's guard: Sub on topic and group)."""

    def timeout_s() -> float:
        return node.settings.send_timeout_ms / 1000

    async def state(payload: memoryview, ctx: RequestContext) -> bytes:
        req = parse(pop_pb2.PopStateRequest, payload)
        check(ctx, req)
        if not node.leader_gate_open():
            # Read after every earlier entry is applied: a new leader's store may lag its log.
            await blocking(node.require_leader)
        return state_answer(node, req).SerializeToString()

    async def receive(payload: memoryview, ctx: RequestContext) -> bytes:
        req = parse(pop_pb2.PopReceiveRequest, payload)
        check(ctx, req)
        check_consume(node.store.group_config(req.consumer_group), broadcasting=False)
        chunk = receive_record(req, _now_ms())
        [outcome] = await node.replicate_async([chunk], timeout_s(), waker)
        answer = receive_answer(outcome)
        # The limit the proxy applies at the group's next receive (the config may change).
        answer.group_retry_max_times = node.store.group_config(req.consumer_group).retry_max_times
        return answer.SerializeToString()

    async def ack(payload: memoryview, ctx: RequestContext) -> bytes:
        req = parse(pop_pb2.PopAckRequest, payload)
        check(ctx, req)
        chunk = ack_record(req, _now_ms())
        [outcome] = await node.replicate_async([chunk], timeout_s(), waker)
        return ack_answer(outcome).SerializeToString()

    return {DataMethod.POP_STATE: state, DataMethod.POP_RECEIVE: receive, DataMethod.POP_ACK: ack}


def _now_ms() -> int:
    # The leader's clock, stamped into the record: replicas apply with it, never their own.
    return time.time_ns() // 1_000_000
