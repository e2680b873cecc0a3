"""The transaction methods of the framed data path (broker/data_server.py): a half send and an
end, answered without a thread per request, as sends are. The same TransactionShell decides as
for gRPC; only a step that may block (a new term's leader gate, a topic auto-created through the
log) runs on the data server's small thread pool. The check-back long poll stays on gRPC: it is
one request per producer and broker group every few seconds."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from google.protobuf.message import Message

from raftmq.broker.transactions_shell import TransactionShell
from raftmq.broker.wakeups import LoopWaker
from raftmq.common.data_api import DataMethod, parse
from raftmq.common.pb import transaction_pb2
from raftmq.common.transport import Handler, RequestContext

TXN_METHODS = frozenset({DataMethod.SEND_HALF_MESSAGE, DataMethod.END_TRANSACTION})
Blocking = Callable[..., Awaitable[Any]]
_M = TypeVar("_M", bound=Message)


def transaction_handlers(
    shell: TransactionShell,
    blocking: Blocking,
    waker: LoopWaker,
    check: Callable[[RequestContext, Message], None] = lambda ctx, req: None,
) -> dict[DataMethod, Handler]:
    """`check` authorizes a parsed request (issue 19; the DataServer's guard)."""
    node = shell.node

    async def send_half(payload: memoryview, ctx: RequestContext) -> bytes:
        req = parse(transaction_pb2.SendHalfMessageRequest, payload)
        check(ctx, req)
        if shell.half_needs_thread(req):
            prepared = await blocking(shell.prepare_half, req)
        else:
            prepared = shell.prepare_half(req)
        [chunk] = await node.replicate_async([prepared.payload], prepared.timeout_s, waker)
        return shell.half_answer(prepared, chunk).SerializeToString()

    async def end(payload: memoryview, ctx: RequestContext) -> bytes:
        req = parse(transaction_pb2.EndTransactionRequest, payload)
        check(ctx, req)
        if shell.end_needs_thread():
            prepared = await blocking(shell.prepare_end, req)
        else:
            prepared = shell.prepare_end(req)
        if isinstance(prepared, transaction_pb2.EndTransactionResponse):
            return prepared.SerializeToString()
        [chunk] = await node.replicate_async([prepared], shell.end_timeout_s, waker)
        return shell.end_answer(req, chunk).SerializeToString()

    return {DataMethod.SEND_HALF_MESSAGE: send_half, DataMethod.END_TRANSACTION: end}
