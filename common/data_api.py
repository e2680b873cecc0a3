"""The methods of the framed data path (common/frame.py, common/transport.py) and their payloads.

Each method carries the same protobuf request and response as the gRPC Broker method of the same
name, so validation, the error table and the SDK's handling are shared; only the transport
differs (about 20x cheaper per call than grpcio here: docs/benchmarks.md). Ids are stable on the
wire: never reuse or renumber one."""

from __future__ import annotations

import enum
from typing import TypeVar

from google.protobuf.message import DecodeError, Message

from raftmq.common.errors import InvalidArgumentError
from raftmq.common.pb import broker_pb2, pop_pb2, transaction_pb2

_M = TypeVar("_M", bound=Message)


class DataMethod(enum.IntEnum):
    SEND_MESSAGE = 1
    PULL_MESSAGE = 2
    COMMIT_OFFSET = 3
    QUERY_OFFSET = 4
    GET_QUEUE_BOUNDS = 5
    SEARCH_OFFSET_BY_TIMESTAMP = 6
    HEARTBEAT = 7
    # Transactions (broker/transactions_data.py); the check-back long poll stays on gRPC.
    SEND_HALF_MESSAGE = 20
    END_TRANSACTION = 21
    # Their batched forms: one request per leader for what a producer's threads made meanwhile.
    SEND_HALF_MESSAGES = 22
    END_TRANSACTIONS = 23
    # The fast data path (issue 14): the ready batches of all a leader's queues in one frame.
    SEND_BATCHES = 50
    # v2 stored batches as the producer encoded them (issue 24): a binary frame, no protobuf
    # (common/stored_send.py), so not in PAYLOADS; each batch's topic is authorized on its own.
    SEND_STORED = 51
    # POP consumption as replicated state (issue 17, broker/pop.py); framed only, no gRPC twin.
    POP_STATE = 60
    POP_RECEIVE = 61
    POP_ACK = 62


# method -> (request type, response type)
PAYLOADS: dict[DataMethod, tuple[type[Message], type[Message]]] = {
    DataMethod.SEND_MESSAGE: (broker_pb2.SendMessageRequest, broker_pb2.SendMessageResponse),
    DataMethod.PULL_MESSAGE: (broker_pb2.PullMessageRequest, broker_pb2.PullMessageResponse),
    DataMethod.COMMIT_OFFSET: (broker_pb2.CommitOffsetRequest, broker_pb2.CommitOffsetResponse),
    DataMethod.QUERY_OFFSET: (broker_pb2.QueryOffsetRequest, broker_pb2.QueryOffsetResponse),
    DataMethod.GET_QUEUE_BOUNDS: (
        broker_pb2.GetQueueBoundsRequest,
        broker_pb2.GetQueueBoundsResponse,
    ),
    DataMethod.SEARCH_OFFSET_BY_TIMESTAMP: (
        broker_pb2.SearchOffsetByTimestampRequest,
        broker_pb2.SearchOffsetByTimestampResponse,
    ),
    DataMethod.HEARTBEAT: (broker_pb2.HeartbeatRequest, broker_pb2.HeartbeatResponse),
    DataMethod.SEND_HALF_MESSAGE: (
        transaction_pb2.SendHalfMessageRequest,
        transaction_pb2.SendHalfMessageResponse,
    ),
    DataMethod.END_TRANSACTION: (
        transaction_pb2.EndTransactionRequest,
        transaction_pb2.EndTransactionResponse,
    ),
    DataMethod.SEND_HALF_MESSAGES: (
        transaction_pb2.SendHalfMessagesRequest,
        transaction_pb2.SendHalfMessagesResponse,
    ),
    DataMethod.END_TRANSACTIONS: (
        transaction_pb2.EndTransactionsRequest,
        transaction_pb2.EndTransactionsResponse,
    ),
    DataMethod.SEND_BATCHES: (broker_pb2.SendBatchesRequest, broker_pb2.SendBatchesResponse),
    DataMethod.POP_STATE: (pop_pb2.PopStateRequest, pop_pb2.PopStateResponse),
    DataMethod.POP_RECEIVE: (pop_pb2.PopReceiveRequest, pop_pb2.PopReceiveResponse),
    DataMethod.POP_ACK: (pop_pb2.PopAckRequest, pop_pb2.PopAckResponse),
}


def parse(cls: type[_M], payload: memoryview) -> _M:
    """The request protobuf of a frame; garbage is the caller's fault (INVALID_ARGUMENT)."""
    try:
        # upb parses any buffer without a copy of the frame; the stubs say bytes only
        return cls.FromString(payload)  # type: ignore[arg-type]
    except (DecodeError, ValueError, TypeError) as exc:
        raise InvalidArgumentError(
            f"the payload of a framed {cls.__name__} is not one ({len(payload)} bytes): {exc}"
        ) from None
