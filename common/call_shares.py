"""Fair shares of a gRPC server's calls in flight per client host (issue 27): a server interceptor,
threaded (broker, NameServer, controller) and asyncio (proxy), that ends a host's call past its
share with THROTTLED before the handler runs, so one client's long polls or floods cannot take
every handler thread. It counts; it never decides anything about the call's content.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import grpc
import grpc.aio

from raftmq.common.errors import ERROR_DETAIL_KEY, RaftMQError, abort_with, row_for, to_detail
from raftmq.common.fair_share import FairShare, ShareLimits, client_host

UNCAPPED_TOTAL = 1 << 30  # the server's own limits (threads, maximum_concurrent_rpcs) bound it


def per_address_cap(setting: int, handler_threads: int) -> int:
    """A role's `rpc_max_calls_per_address` in force: as set, or 0 = all but an eighth of its
    handler threads (a host may run that many at once; the other hosts keep the rest). Not
    less: on one machine every process of a local cluster is the same host (127.0.0.1), and its
    own registrations and lookups must not be refused in a burst."""
    return setting if setting > 0 else max(1, handler_threads - max(1, handler_threads // 8))


class _Shares:
    def __init__(self, per_address: int) -> None:
        self._shares = FairShare(
            ShareLimits(UNCAPPED_TOTAL, per_address, what="gRPC calls in flight")
        )
        self._lock = threading.Lock()

    def admit(self, peer: str) -> tuple[str, RaftMQError | None]:
        host = client_host(peer)
        with self._lock:
            return host, self._shares.admit(host)

    def release(self, host: str) -> None:
        with self._lock:
            self._shares.release(host)


# grpc-stubs declares the interceptors generic; the runtime classes cannot be subscripted.
class CallShares(grpc.ServerInterceptor):  # type: ignore[type-arg]
    """For a threaded grpc.Server: unary calls (all ours are) counted per client host."""

    def __init__(self, per_address: int) -> None:
        self._shares = _Shares(per_address)

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler[Any, Any] | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        inner = handler.unary_unary
        shares = self._shares

        def behavior(request: Any, context: grpc.ServicerContext) -> Any:
            host, refused = shares.admit(context.peer())
            if refused is not None:
                abort_with(context, refused)
            try:
                return inner(request, context)
            finally:
                shares.release(host)

        return grpc.unary_unary_rpc_method_handler(
            behavior,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


async def _abort(context: grpc.aio.ServicerContext[Any, Any], exc: RaftMQError) -> None:
    row = row_for(type(exc))
    context.set_trailing_metadata(((ERROR_DETAIL_KEY, to_detail(exc).SerializeToString()),))
    await context.abort(row.status, exc.message)


# Generic in grpc-stubs only, as above.
class AioCallShares(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """For a grpc.aio server: every call kind counted per client host while it runs (a
    stream for as long as it is open)."""

    def __init__(self, per_address: int) -> None:
        self._shares = _Shares(per_address)

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        shares = self._shares
        kw = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_unary is not None:
            unary = handler.unary_unary

            async def unary_behavior(request: Any, context: Any) -> Any:
                host, refused = shares.admit(context.peer())
                if refused is not None:
                    await _abort(context, refused)
                try:
                    return await unary(request, context)
                finally:
                    shares.release(host)

            return grpc.unary_unary_rpc_method_handler(unary_behavior, **kw)
        if handler.unary_stream is not None or handler.stream_stream is not None:
            streaming = handler.unary_stream or handler.stream_stream
            assert streaming is not None
            make = (
                grpc.unary_stream_rpc_method_handler
                if handler.unary_stream is not None
                else grpc.stream_stream_rpc_method_handler
            )

            async def stream_behavior(request: Any, context: Any) -> AsyncIterator[Any]:
                host, refused = shares.admit(context.peer())
                if refused is not None:
                    await _abort(context, refused)
                try:
                    async for item in _aiter(streaming(request, context)):
                        yield item
                finally:
                    shares.release(host)

            return make(stream_behavior, **kw)
        return handler  # stream-unary: none of ours


async def _aiter(result: Any) -> AsyncIterator[Any]:
    """A streaming behavior's answers, whether it is an async generator or a coroutine that
    writes to the context itself (then it yields nothing here)."""
    if hasattr(result, "__aiter__"):
        async for item in result:
            yield item
    elif isinstance(result, Iterator):
        for item in result:
            yield item
    else:
        await result
