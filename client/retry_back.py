"""The PushConsumer's side of retries and dead letters (RocketMQ's sendMessageBack): a message the
listener failed is sent back to its broker group, which stores it in %RETRY%<group> with the
back-off delay, or in %DLQ%<group> past max_reconsume_times (broker/send_back.py decides). And the
view the listener gets of a retried message: its original topic and its reconsume count.

A send-back that fails raises; the consumer then keeps the message and retries it locally, so a
message is never lost or skipped."""

from __future__ import annotations

import logging
import time

import grpc

from raftmq.client.messages import ReceivedMessage
from raftmq.client.routes import ChannelPool, RouteCache
from raftmq.client.trace import TraceSender
from raftmq.common.errors import NotLeaderError, RaftMQError, from_rpc_error
from raftmq.common.pb import broker_pb2
from raftmq.common.retry import PROPERTY_ORIGIN_MESSAGE_ID, PROPERTY_RETRY_TOPIC, reconsume_times
from raftmq.common.trace import MoveKind, MoveTrace

log = logging.getLogger("raftmq.consumer")

SEND_BACK_ATTEMPTS = 3  # a leader change costs one; more is the local retry's job
SEND_BACK_TIMEOUT_S = 5.0


def listener_view(m: ReceivedMessage) -> ReceivedMessage:
    """What the listener sees: a message from %RETRY%<group> under its original topic, with the
    count of earlier failed deliveries (RocketMQ's resetRetryAndNamespace)."""
    original = m.properties.get(PROPERTY_RETRY_TOPIC)
    times = reconsume_times(m.properties)
    if original is None and times == m.reconsume_times:
        return m
    return m.replace(topic=original or m.topic, reconsume_times=times)


class SendBack:
    """The one way a consumer hands a failed message back (push and orderly consumers, the
    proxy): the broker stores the copy, and with a tracer each move is traced (a MoveTrace)."""

    def __init__(
        self,
        group: str,
        routes: RouteCache,
        pool: ChannelPool,
        tracer: TraceSender | None = None,
    ) -> None:
        self._group = group
        self._routes = routes
        self._pool = pool
        self._tracer = tracer

    def send(
        self,
        m: ReceivedMessage,
        max_reconsume_times: int,
        delay_level: int = 0,
        reconsume_times: int = 0,
    ) -> broker_pb2.ConsumerSendBackResponse:
        """Send `m` (as delivered: its own topic, not the listener's view) back; raises the
        typed error of the last attempt. `reconsume_times`: failures counted by the consumer
        itself (an orderly consumer's local retries), when more than the message carries."""
        req = broker_pb2.ConsumerSendBackRequest(
            consumer_group=self._group,
            msg_id=m.msg_id,
            max_reconsume_times=max_reconsume_times,
            delay_level=delay_level,
            reconsume_times=reconsume_times,
        )
        last: RaftMQError | None = None
        for attempt in range(SEND_BACK_ATTEMPTS):
            address = last.leader_hint if isinstance(last, NotLeaderError) else ""
            try:
                if not address:
                    address = self._routes.leader(m.topic, m.broker_group, refresh=attempt > 0)
                back = self._pool.broker(address).ConsumerSendBack(req, timeout=SEND_BACK_TIMEOUT_S)
            except grpc.RpcError as exc:
                last = from_rpc_error(exc)
            except RaftMQError as exc:
                last = exc
            else:
                self._trace(m, back)
                return back
            if not last.retryable:
                break
        assert last is not None
        raise last

    def _trace(self, m: ReceivedMessage, back: broker_pb2.ConsumerSendBackResponse) -> None:
        if self._tracer is None:
            return
        self._tracer.record(
            MoveTrace(
                msg_id=m.properties.get(PROPERTY_ORIGIN_MESSAGE_ID, m.msg_id),
                timestamp_ms=time.time_ns() // 1_000_000,
                move=MoveKind.DEAD_LETTER if back.dead_letter else MoveKind.RETRY,
                group=self._group,
                from_topic=m.topic,
                to_topic=back.topic,
                reconsume_times=back.reconsume_times,
                new_msg_id=back.msg_id,
                delay_ms=back.delay_ms,  # the broker's level delay (issue 26: it read 0)
            )
        )
