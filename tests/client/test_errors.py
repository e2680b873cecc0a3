"""The error table over a real gRPC server on loopback: every row survives the round trip."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent import futures

import grpc
import pytest

from raftmq.common import errors
from raftmq.common.errors import (
    ERROR_DETAIL_KEY,
    ERROR_TABLE,
    BrokerUnavailableError,
    ErrorRow,
    Fault,
    InternalError,
    InvalidArgumentError,
    NotLeaderError,
    OffsetOutOfRangeError,
    RaftMQError,
    RequestTimeoutError,
    TopicNotFoundError,
    from_rpc_error,
    rpc_errors,
)
from raftmq.common.pb import common_pb2

SERVICE = "raftmq.test.Errors"
LEADER = "10.0.0.9:10911"
_BY_CODE = {row.code: row for row in ERROR_TABLE}


def message_for(row: ErrorRow) -> str:
    return f"{row.code.lower()} happened; do the documented next step"


class Handlers:
    """Test handlers, decorated exactly like real servicer methods."""

    @rpc_errors
    def Raise(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        row = _BY_CODE[request.decode()]
        hint = LEADER if row.exc is NotLeaderError else ""
        raise row.exc(message_for(row), leader_hint=hint, details={"row": row.code})

    @rpc_errors
    def Crash(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        raise ValueError("secret internals: /etc/passwd line 3")

    @rpc_errors
    def AbortDirect(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, "aborted by the handler itself")

    @rpc_errors
    def Bare(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        context.abort(grpc.StatusCode.UNAVAILABLE, "going away")

    @rpc_errors
    def Garbled(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        context.set_trailing_metadata(((ERROR_DETAIL_KEY, b"\xff\xff not a proto"),))
        context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "slow down")

    @rpc_errors
    def Slow(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        time.sleep(1.0)
        return b"late"

    @rpc_errors
    def OutOfRange(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        raise OffsetOutOfRangeError.for_offset("orders", 3, 99, 10, 50)

    @rpc_errors
    def Echo(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        return request


@pytest.fixture(scope="module")
def channel() -> Iterator[grpc.Channel]:
    handlers = Handlers()
    methods = {
        name: grpc.unary_unary_rpc_method_handler(getattr(handlers, name))
        for name in (
            "Raise",
            "Crash",
            "AbortDirect",
            "Bare",
            "Garbled",
            "Slow",
            "OutOfRange",
            "Echo",
        )
    }
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, methods),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    ch = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield ch
    finally:
        ch.close()
        server.stop(0).wait()


def call(channel: grpc.Channel, method: str, request: bytes = b"", timeout: float = 5.0) -> bytes:
    fn: Callable[..., bytes] = channel.unary_unary(f"/{SERVICE}/{method}", None, None)
    return fn(request, timeout=timeout)


def fail(
    channel: grpc.Channel, method: str, request: bytes = b"", timeout: float = 5.0
) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call(channel, method, request, timeout)
    return info.value


def test_server_answers_normally(channel: grpc.Channel) -> None:
    assert call(channel, "Echo", b"hello") == b"hello"


@pytest.mark.parametrize("row", ERROR_TABLE, ids=[row.code for row in ERROR_TABLE])
def test_every_row_round_trips(channel: grpc.Channel, row: ErrorRow) -> None:
    rpc_error = fail(channel, "Raise", row.code.encode())
    assert rpc_error.code() is row.status
    assert rpc_error.details() == message_for(row)

    exc = from_rpc_error(rpc_error)
    assert type(exc) is row.exc
    assert exc.message == message_for(row)
    assert exc.code == row.code
    assert exc.fault is row.fault
    assert exc.retryable is row.retryable
    assert exc.details == {"row": row.code}
    assert exc.leader_hint == (LEADER if row.exc is NotLeaderError else "")


def test_table_matches_proto_error_codes() -> None:
    proto = set(common_pb2.ErrorCode.keys()) - {"ERROR_CODE_UNSPECIFIED"}
    assert {row.code for row in ERROR_TABLE} == proto
    assert len({row.exc for row in ERROR_TABLE}) == len(ERROR_TABLE)
    # every caller-fault row is non-retryable; every class in the module is tabled
    assert all(not row.retryable for row in ERROR_TABLE if row.fault is Fault.CALLER)
    classes = {
        obj
        for obj in vars(errors).values()
        if isinstance(obj, type) and issubclass(obj, RaftMQError) and obj is not RaftMQError
    }
    assert classes == {row.exc for row in ERROR_TABLE}


def test_unexpected_exception_is_internal_without_traceback(channel: grpc.Channel) -> None:
    rpc_error = fail(channel, "Crash")
    assert rpc_error.code() is grpc.StatusCode.INTERNAL
    text = rpc_error.details() or ""
    assert "Traceback" not in text and "secret" not in text and "passwd" not in text
    assert "ValueError" in text and "error_id=" in text
    exc = from_rpc_error(rpc_error)
    assert isinstance(exc, InternalError)
    assert len(exc.details["error_id"]) == 12


def test_handler_abort_passes_through_unchanged(channel: grpc.Channel) -> None:
    rpc_error = fail(channel, "AbortDirect")
    assert rpc_error.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert rpc_error.details() == "aborted by the handler itself"
    exc = from_rpc_error(rpc_error)
    assert type(exc) is InvalidArgumentError
    assert exc.details == {"grpc_status": "FAILED_PRECONDITION"}


def test_bare_status_maps_to_nearest_type(channel: grpc.Channel) -> None:
    exc = from_rpc_error(fail(channel, "Bare"))
    assert type(exc) is BrokerUnavailableError
    assert "going away" in exc.message and exc.retryable


def test_garbled_detail_falls_back_to_status(channel: grpc.Channel) -> None:
    exc = from_rpc_error(fail(channel, "Garbled"))
    assert type(exc) is errors.ThrottledError


def test_deadline_is_request_timeout(channel: grpc.Channel) -> None:
    rpc_error = fail(channel, "Slow", timeout=0.2)
    assert rpc_error.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    assert type(from_rpc_error(rpc_error)) is RequestTimeoutError


def test_unreachable_server_is_broker_unavailable() -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        rpc_error = fail(ch, "Echo", timeout=2.0)
    exc = from_rpc_error(rpc_error)
    assert type(exc) is BrokerUnavailableError
    assert "retry" in exc.message


def test_constructors_say_what_to_do_next(channel: grpc.Channel) -> None:
    exc = TopicNotFoundError.for_topic("orders")
    assert "auto-create is off" in exc.message
    assert "`raftmq topic create orders`" in exc.message

    nl = NotLeaderError.for_node("n1", "broker-a", LEADER)
    assert nl.leader_hint == LEADER and "retry there" in nl.message
    assert "refresh routes" in NotLeaderError.for_node("n1", "broker-a", "").message

    oor = OffsetOutOfRangeError.for_offset("orders", 3, 99, 10, 50)
    assert (oor.min_offset, oor.max_offset) == (10, 50)


def test_structured_details_survive_the_wire(channel: grpc.Channel) -> None:
    rpc_error = fail(channel, "OutOfRange")
    assert rpc_error.code() is grpc.StatusCode.OUT_OF_RANGE
    exc = from_rpc_error(rpc_error)
    assert isinstance(exc, OffsetOutOfRangeError)
    assert (exc.min_offset, exc.max_offset) == (10, 50)
    assert "reset the group's offsets by timestamp" in exc.message


def test_long_messages_are_clipped() -> None:
    detail = errors.to_detail(InvalidArgumentError("x" * 10_000))
    assert len(detail.message) == errors.MAX_MESSAGE_CHARS
    assert detail.message.endswith("...")


def test_base_class_and_untabled_subclass_map_to_internal() -> None:
    class Custom(RaftMQError):
        pass

    assert errors.row_for(Custom).exc is InternalError
    assert errors.row_for(RaftMQError).status is grpc.StatusCode.INTERNAL
