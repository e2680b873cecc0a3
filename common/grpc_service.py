"""Registers a servicer with a grpc.Server so that a request that does not parse is the caller's
fault: INVALID_ARGUMENT with a message from the error table, never grpcio's bare INTERNAL
("Exception deserializing request"). Used by every role in place of the generated
`add_XServicer_to_server`; unary-unary methods only (all of ours)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass

from raftmq.common.errors import InvalidArgumentError, abort_with


def _handler(
    service: str, method: str, request_type: type[Message], call: Callable[..., Any]
) -> grpc.RpcMethodHandler[bytes, Any]:
    def handle(raw: bytes, context: grpc.ServicerContext) -> Any:
        try:
            request = request_type.FromString(raw)
        except (DecodeError, ValueError) as exc:  # bad wire bytes, invalid UTF-8 in a string
            abort_with(
                context,
                InvalidArgumentError(
                    f"malformed {service}.{method} request ({len(raw)} bytes): {exc}; "
                    "send a serialized raftmq.v1 message of the method's request type",
                    details={"method": f"{service}/{method}"},
                ),
            )
        return call(request, context)

    return grpc.unary_unary_rpc_method_handler(
        handle,
        request_deserializer=None,  # raw bytes: parsed in `handle`, where errors are typed
        response_serializer=lambda response: response.SerializeToString(),
    )


def add_servicer(server: grpc.Server, servicer: object, service: ServiceDescriptor) -> None:
    """Serve every method of `service` from the same-named method of `servicer`."""
    handlers = {
        m.name: _handler(
            service.name, m.name, GetMessageClass(m.input_type), getattr(servicer, m.name)
        )
        for m in service.methods
    }
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service.full_name, handlers),)
    )
