"""The PushConsumer's side of retries and dead letters (RocketMQ's sendMessageBack): a message the
listener failed is sent back to its broker group, which stores it in %RETRY%<group> with the
back-off delay, or in %DLQ%<group> past max_reconsume_times (broker/send_back.py decides). And the
view the listener gets of a retried message: its original topic and its reconsume count.

A send-back that fails raises; the consumer then keeps the message and retries it locally, so a
message is never lost or skipped."""

from __future__ import annotations

import dataclasses
import logging

import grpc

from raftmq.client.messages import ReceivedMessage
from raftmq.client.routes import ChannelPool, RouteCache
from raftmq.common.errors import NotLeaderError, RaftMQError, from_rpc_error
from raftmq.common.pb import broker_pb2
from raftmq.common.retry import PROPERTY_RETRY_TOPIC, reconsume_times

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
    return dataclasses.replace(m, topic=original or m.topic, reconsume_times=times)


class SendBack:
    def __init__(self, group: str, routes: RouteCache, pool: ChannelPool) -> None:
        self._group = group
        self._routes = routes
        self._pool = pool

    def send(
        self, m: ReceivedMessage, max_reconsume_times: int, delay_level: int = 0
    ) -> broker_pb2.ConsumerSendBackResponse:
        """Send `m` (as delivered: its own topic, not the listener's view) back; raises the
        typed error of the last attempt."""
        req = broker_pb2.ConsumerSendBackRequest(
            consumer_group=self._group,
            msg_id=m.msg_id,
            max_reconsume_times=max_reconsume_times,
            delay_level=delay_level,
        )
        last: RaftMQError | None = None
        for attempt in range(SEND_BACK_ATTEMPTS):
            address = last.leader_hint if isinstance(last, NotLeaderError) else ""
            try:
                if not address:
                    address = self._routes.leader(m.topic, m.broker_group, refresh=attempt > 0)
                return self._pool.broker(address).ConsumerSendBack(req, timeout=SEND_BACK_TIMEOUT_S)
            except grpc.RpcError as exc:
                last = from_rpc_error(exc)
            except RaftMQError as exc:
                last = exc
            if not last.retryable:
                break
        assert last is not None
        raise last
