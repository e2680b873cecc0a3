"""The POP methods of the framed data path (broker/pop.py) on a BrokerNode over a MemoryLog with
real lmdb stores and its DataServer: a receive answers what the apply handed out, the state read
back names the same deliveries, an ack and a stale ack, and bad requests answered with typed
errors (never a traceback)."""

from __future__ import annotations

import pytest

from raftmq.broker.data_server import DataServer
from raftmq.broker.node import BrokerNode
from raftmq.common.data_api import DataMethod
from raftmq.common.errors import InvalidArgumentError, InvalidNameError
from raftmq.common.pb import pop_pb2
from raftmq.common.transport import FrameClient, LoopThread
from tests.broker.test_data_server_inprocess import call, node, served  # noqa: F401

Served = tuple[DataServer, LoopThread, FrameClient]


def test_receive_state_and_ack(node: BrokerNode, served: Served) -> None:  # noqa: F811
    _, _, client = served
    part = pop_pb2.PopQueuePart(
        queue_id=0, init_offset=0, pulled=True, pulled_from=0, next_offset=3, take=2,
        new_offsets=[0, 1, 2],
    )  # fmt: skip
    req = pop_pb2.PopReceiveRequest(
        consumer_group="g", topic="T", invisible_ms=60_000, max_inflight=100, parts=[part]
    )
    got = pop_pb2.PopReceiveResponse.FromString(call(client, DataMethod.POP_RECEIVE, req))
    [r] = got.parts
    assert [d.offset for d in r.handed] == [0, 1] and r.cursor == 2
    assert all(d.attempt == 1 for d in r.handed)
    state = pop_pb2.PopStateResponse.FromString(
        call(
            client,
            DataMethod.POP_STATE,
            pop_pb2.PopStateRequest(consumer_group="g", topic="T", queue_ids=[0, 1]),
        )
    )
    q0, q1 = state.queues
    assert q0.exists and q0.cursor == 2 and list(q0.inflight) == list(r.handed)
    assert not q1.exists
    token = r.handed[0].token
    ack = pop_pb2.PopAckRequest(
        consumer_group="g",
        topic="T",
        entries=[
            pop_pb2.PopAckEntry(queue_id=0, offset=0, token=token),
            pop_pb2.PopAckEntry(queue_id=0, offset=1, token=token + 1),
        ],
    )
    acked = pop_pb2.PopAckResponse.FromString(call(client, DataMethod.POP_ACK, ack))
    assert [x.outcome for x in acked.results] == [pop_pb2.POP_ACK_DONE, pop_pb2.POP_ACK_STALE]
    assert node.store.committed_offset("g", "T", 0) == 1


@pytest.mark.parametrize(
    ("method", "req", "error"),
    [
        (
            DataMethod.POP_RECEIVE,
            pop_pb2.PopReceiveRequest(consumer_group="g", topic="T", invisible_ms=0),
            InvalidArgumentError,
        ),
        (
            DataMethod.POP_RECEIVE,
            pop_pb2.PopReceiveRequest(consumer_group="bad group", topic="T", invisible_ms=10),
            InvalidNameError,
        ),
        (
            DataMethod.POP_ACK,
            pop_pb2.PopAckRequest(consumer_group="g", topic="T"),
            InvalidArgumentError,
        ),
        (
            DataMethod.POP_STATE,
            pop_pb2.PopStateRequest(consumer_group="g", topic="T", queue_ids=[1 << 31]),
            InvalidArgumentError,
        ),
    ],
)
def test_bad_requests_are_typed_errors(
    served: Served,  # noqa: F811
    method: DataMethod,
    req: object,
    error: type[Exception],
) -> None:
    _, _, client = served
    with pytest.raises(error) as info:
        call(client, method, req)
    assert str(info.value) and "Traceback" not in str(info.value)
