"""apache.rocketmq.v2.MessagingService on a grpc.aio server: every method's handler, with the
request parsed here, so malformed bytes get a v2 BAD_REQUEST status instead of grpcio's bare
INTERNAL, and any failure of a handler becomes its response's v2 status (never a traceback).
Methods not served yet answer NOT_IMPLEMENTED."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError, Message

from raftmq.common.auth_guard import CALLER, Guard
from raftmq.common.errors import RaftMQError
from raftmq.common.pb.apache.rocketmq.v2 import definition_pb2 as v2
from raftmq.common.pb.apache.rocketmq.v2 import service_pb2 as svc
from raftmq.proxy.codes import ApiError, status_of
from raftmq.proxy.service import MessagingService

log = logging.getLogger("proxy")

SERVICE = svc.DESCRIPTOR.services_by_name["MessagingService"]


def _response_type(method: str) -> type[Message]:
    m = SERVICE.methods_by_name[method]
    return getattr(svc, m.output_type.name)  # type: ignore[no-any-return]


def _request_type(method: str) -> type[Message]:
    m = SERVICE.methods_by_name[method]
    return getattr(svc, m.input_type.name)  # type: ignore[no-any-return]


def _bad_request(method: str, raw: bytes, exc: Exception) -> v2.Status:
    return v2.Status(
        code=v2.BAD_REQUEST,
        message=f"malformed {method} request ({len(raw)} bytes): {exc}; send a serialized "
        f"apache.rocketmq.v2.{_request_type(method).__name__}",
    )


def _checked(guard: Guard | None, method: str, request: Message, context: Any) -> None:
    """Issue 19: the official client's `authorization` header and the method's rule, checked
    here, the node that serves the call; a failure is the response's v2 status (UNAUTHORIZED,
    FORBIDDEN), as RocketMQ's proxy answers. The subject is the call's CALLER (its quotas)."""
    if guard is not None:
        subject = guard.authenticate_metadata(context.invocation_metadata())
        guard.check_path(subject, f"/{SERVICE.full_name}/{method}", request)
        CALLER.set(subject)


def _unary(
    method: str, fn: Callable[[Any, Any], Awaitable[Message]], guard: Guard | None = None
) -> grpc.RpcMethodHandler[Any, Any]:
    req_t, resp_t = _request_type(method), _response_type(method)

    async def handle(raw: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> Message:
        try:
            request = req_t.FromString(raw)
        except (DecodeError, ValueError) as exc:
            return resp_t(status=_bad_request(method, raw, exc))
        try:
            _checked(guard, method, request, context)
            return await fn(request, context)
        except Exception as exc:
            if not isinstance(exc, (ApiError, RaftMQError)):
                log.exception("proxy.handler_failed method=%s", method)
            return resp_t(status=status_of(exc))

    return grpc.unary_unary_rpc_method_handler(
        handle, response_serializer=lambda r: r.SerializeToString()
    )


def add_to_server(
    server: grpc.aio.Server, service: MessagingService, guard: Guard | None = None
) -> None:
    """Every method of MessagingService; requests are parsed here, so a malformed one gets a v2
    BAD_REQUEST status instead of grpcio's bare INTERNAL."""
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
    unimplemented = {m.name for m in SERVICE.methods}
    for name in (
        "QueryRoute",
        "Heartbeat",
        "SendMessage",
        "QueryAssignment",
        "AckMessage",
        "NotifyClientTermination",
        "ChangeInvisibleDuration",
        "EndTransaction",
        "ForwardMessageToDeadLetterQueue",
    ):
        handlers[name] = _unary(name, getattr(service, name), guard)
        unimplemented.discard(name)

    async def receive(
        raw: bytes, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Message]:
        try:
            request = svc.ReceiveMessageRequest.FromString(raw)
        except (DecodeError, ValueError) as exc:
            yield svc.ReceiveMessageResponse(status=_bad_request("ReceiveMessage", raw, exc))
            return
        try:
            _checked(guard, "ReceiveMessage", request, context)
        except RaftMQError as exc:
            yield svc.ReceiveMessageResponse(status=status_of(exc))
            return
        async for r in service.ReceiveMessage(request, context):
            yield r

    handlers["ReceiveMessage"] = grpc.unary_stream_rpc_method_handler(
        receive, response_serializer=lambda r: r.SerializeToString()
    )
    unimplemented.discard("ReceiveMessage")

    async def telemetry(
        requests: AsyncIterator[svc.TelemetryCommand],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[Message]:
        if guard is not None:  # the stream's opening carries the signature
            try:
                guard.authenticate_metadata(context.invocation_metadata())
            except RaftMQError as exc:
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, exc.message)
        async for r in service.Telemetry(requests, context):
            yield r

    handlers["Telemetry"] = grpc.stream_stream_rpc_method_handler(
        telemetry if guard is not None else service.Telemetry,
        request_deserializer=svc.TelemetryCommand.FromString,
        response_serializer=lambda r: r.SerializeToString(),
    )
    unimplemented.discard("Telemetry")
    for name in sorted(unimplemented):
        handlers[name] = _not_yet(name)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE.full_name, handlers),)
    )


def _not_yet(method: str) -> grpc.RpcMethodHandler[Any, Any]:
    m = SERVICE.methods_by_name[method]
    resp_t = _response_type(method)
    status = v2.Status(
        code=v2.NOT_IMPLEMENTED,
        message=f"{method} is not served by this raftmq proxy yet",
    )

    async def unary(raw: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> Message:
        return resp_t(status=status)

    async def stream(
        raw: bytes, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Message]:
        yield resp_t(status=status)

    if m.server_streaming:
        return grpc.unary_stream_rpc_method_handler(
            stream, response_serializer=lambda r: r.SerializeToString()
        )
    return grpc.unary_unary_rpc_method_handler(
        unary, response_serializer=lambda r: r.SerializeToString()
    )
