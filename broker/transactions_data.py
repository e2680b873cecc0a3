"""The transaction methods of the framed data path (broker/data_server.py): a half send and an
end, answered without a thread per request, as sends are, and their batched forms (the half
sends or the ends a producer's threads made while its previous request was in flight: one
request, one hand-off to the log for all its chunks, each item answered apart). The same
TransactionShell decides as for gRPC; only a step that may block (a new term's leader gate, a
topic auto-created through the log) runs on the data server's small thread pool. The check-back
long poll stays on gRPC: it is one request per producer and broker group every few seconds."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from google.protobuf.message import Message

from raftmq.broker.transactions_shell import PreparedHalf, TransactionShell
from raftmq.broker.wakeups import LoopWaker
from raftmq.common.data_api import DataMethod, parse
from raftmq.common.errors import InvalidArgumentError, RaftMQError, to_detail
from raftmq.common.pb import transaction_pb2
from raftmq.common.transport import Handler, RequestContext

TXN_METHODS = frozenset(
    {
        DataMethod.SEND_HALF_MESSAGE,
        DataMethod.END_TRANSACTION,
        DataMethod.SEND_HALF_MESSAGES,
        DataMethod.END_TRANSACTIONS,
    }
)
MAX_BATCH_ITEMS = 1024  # halves or ends per batched request (the SDK sends at most 256)
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

    async def prepared_half(
        req: transaction_pb2.SendHalfMessageRequest, ctx: RequestContext
    ) -> PreparedHalf:
        check(ctx, req)
        if shell.half_needs_thread(req):
            prepared: PreparedHalf = await blocking(shell.prepare_half, req)
            return prepared
        return shell.prepare_half(req)

    async def send_halves(payload: memoryview, ctx: RequestContext) -> bytes:
        batch = parse(transaction_pb2.SendHalfMessagesRequest, payload)
        _check_size(len(batch.halves), "halves")
        results = [transaction_pb2.HalfMessageResult() for _ in batch.halves]
        ready: list[tuple[int, PreparedHalf]] = []
        for i, req in enumerate(batch.halves):
            try:
                ready.append((i, await prepared_half(req, ctx)))
            except RaftMQError as exc:
                results[i].error.CopyFrom(to_detail(exc))
        if ready:
            timeout_s = max(p.timeout_s for _, p in ready)
            outcomes = await node.replicate_each_async(
                [p.payload for _, p in ready], timeout_s, waker
            )
            for (i, prepared), outcome in zip(ready, outcomes, strict=True):
                try:
                    if isinstance(outcome, RaftMQError):
                        raise outcome
                    results[i].response.CopyFrom(shell.half_answer(prepared, outcome))
                except RaftMQError as exc:
                    results[i].error.CopyFrom(to_detail(exc))
        return transaction_pb2.SendHalfMessagesResponse(results=results).SerializeToString()

    async def end_many(payload: memoryview, ctx: RequestContext) -> bytes:
        batch = parse(transaction_pb2.EndTransactionsRequest, payload)
        _check_size(len(batch.ends), "ends")
        results = [transaction_pb2.EndTransactionResult() for _ in batch.ends]
        ready: list[tuple[int, bytes]] = []
        gate_closed = shell.end_needs_thread()
        for i, req in enumerate(batch.ends):
            try:
                check(ctx, req)
                if gate_closed:
                    prepared = await blocking(shell.prepare_end, req)
                else:
                    prepared = shell.prepare_end(req)
            except RaftMQError as exc:
                results[i].error.CopyFrom(to_detail(exc))
                continue
            if isinstance(prepared, transaction_pb2.EndTransactionResponse):
                results[i].response.CopyFrom(prepared)
            else:
                ready.append((i, prepared))
        if ready:
            outcomes = await node.replicate_each_async(
                [p for _, p in ready], shell.end_timeout_s, waker
            )
            for (i, _), outcome in zip(ready, outcomes, strict=True):
                try:
                    if isinstance(outcome, RaftMQError):
                        raise outcome
                    results[i].response.CopyFrom(shell.end_answer(batch.ends[i], outcome))
                except RaftMQError as exc:
                    results[i].error.CopyFrom(to_detail(exc))
        return transaction_pb2.EndTransactionsResponse(results=results).SerializeToString()

    return {
        DataMethod.SEND_HALF_MESSAGE: send_half,
        DataMethod.END_TRANSACTION: end,
        DataMethod.SEND_HALF_MESSAGES: send_halves,
        DataMethod.END_TRANSACTIONS: end_many,
    }


def _check_size(n: int, what: str) -> None:
    if not 1 <= n <= MAX_BATCH_ITEMS:
        raise InvalidArgumentError(
            f"a batched transaction request carries 1..{MAX_BATCH_ITEMS} {what}, got {n}: split it"
        )
