"""The transaction methods of the framed data path (broker/data_server.py): a half send and an
end, answered without a thread per request, as sends are, and their batched forms (the half
sends or the ends a producer's threads made while its previous request was in flight: one
request, one hand-off to the log for all its chunks, each item answered apart). The same
TransactionShell decides as for gRPC; only a step that may block (a new term's leader gate, a
topic auto-created through the log) runs on the data server's small thread pool. The check-back
long poll stays on gRPC: it is one request per producer and broker group every few seconds."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from google.protobuf.message import Message

from raftmq.broker.transactions_shell import PreparedHalf, TransactionShell
from raftmq.broker.wakeups import LoopWaker
from raftmq.common.data_api import DataMethod, parse
from raftmq.common.errors import InvalidArgumentError, RaftMQError, to_detail
from raftmq.common.pb import transaction_pb2
from raftmq.common.quota import Flow
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
_P = TypeVar("_P")  # what preparing an item gives


def transaction_handlers(
    shell: TransactionShell,
    blocking: Blocking,
    waker: LoopWaker,
    check: Callable[[RequestContext, Message], None] = lambda ctx, req: None,
) -> dict[DataMethod, Handler]:
    """`check` authorizes a parsed request (issue 19; the DataServer's guard)."""
    node = shell.node

    async def held(ctx: RequestContext, timeout_s: float) -> int:
        """A half send is a produce (issue 27): held for its user's produce quota, at most half
        its time limit (the rest is for storing it), as sends are; the ms held."""
        ms, _ = await node.quota.turn(Flow.PRODUCE, ctx.principal, int(timeout_s * 500))
        return ms

    async def send_half(payload: memoryview, ctx: RequestContext) -> bytes:
        req = parse(transaction_pb2.SendHalfMessageRequest, payload)
        check(ctx, req)
        if shell.half_needs_thread(req):
            prepared = await blocking(shell.prepare_half, req)
        else:
            prepared = shell.prepare_half(req)
        throttle_ms = await held(ctx, prepared.timeout_s)
        [chunk] = await node.replicate_async([prepared.payload], prepared.timeout_s, waker)
        answer = shell.half_answer(prepared, chunk)
        node.quota.charge(Flow.PRODUCE, ctx.principal, len(payload))
        answer.throttle_ms = throttle_ms
        return answer.SerializeToString()

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

    async def checked_each(
        reqs: Sequence[_M], prepare: Callable[[_M], _P], needs_thread: bool, ctx: RequestContext
    ) -> list[_P | RaftMQError]:
        """Authorize and prepare each item (its result or its typed error), on the loop, or
        in one trip to the pool when any item may block."""

        def run() -> list[_P | RaftMQError]:
            out: list[_P | RaftMQError] = []
            for req in reqs:
                try:
                    check(ctx, req)
                    out.append(prepare(req))
                except RaftMQError as exc:
                    out.append(exc)
            return out

        if needs_thread:
            done: list[_P | RaftMQError] = await blocking(run)
            return done
        return run()

    async def replicated(
        answers: list[Any],
        payloads: Mapping[int, bytes | bytearray],
        timeout_s: float,
        answer: Callable[..., Any],
    ) -> None:
        """Replicate `payloads` (item index -> chunk) with one hand-off and put each item's
        answer, `answer(i, outcome)` or its typed error, in `answers`."""
        if not payloads:
            return
        outcomes = await node.replicate_each_async(list(payloads.values()), timeout_s, waker)
        for i, outcome in zip(payloads, outcomes, strict=True):
            try:
                if isinstance(outcome, RaftMQError):
                    raise outcome
                answers[i] = answer(i, outcome)
            except RaftMQError as exc:
                answers[i] = exc

    async def send_halves(payload: memoryview, ctx: RequestContext) -> bytes:
        batch = parse(transaction_pb2.SendHalfMessagesRequest, payload)
        _check_size(len(batch.halves), "halves")
        needs_thread = any(shell.half_needs_thread(r) for r in batch.halves)
        prepared = await checked_each(batch.halves, shell.prepare_half, needs_thread, ctx)
        answers: list[Any] = list(prepared)
        ready = {i: p for i, p in enumerate(prepared) if isinstance(p, PreparedHalf)}
        timeout_s = max((p.timeout_s for p in ready.values()), default=0.0)
        throttle_ms = await held(ctx, timeout_s) if ready else 0
        await replicated(
            answers,
            {i: p.payload for i, p in ready.items()},
            timeout_s,
            lambda i, outcome: shell.half_answer(ready[i], outcome),
        )
        if ready:
            node.quota.charge(Flow.PRODUCE, ctx.principal, len(payload))
        results = [transaction_pb2.HalfMessageResult() for _ in answers]
        _fill(results, answers)
        return transaction_pb2.SendHalfMessagesResponse(
            results=results, throttle_ms=throttle_ms
        ).SerializeToString()

    async def end_many(payload: memoryview, ctx: RequestContext) -> bytes:
        batch = parse(transaction_pb2.EndTransactionsRequest, payload)
        _check_size(len(batch.ends), "ends")
        prepared = await checked_each(batch.ends, shell.prepare_end, shell.end_needs_thread(), ctx)
        answers: list[Any] = list(prepared)  # an answer already, an error, or a chunk to commit
        await replicated(
            answers,
            {i: p for i, p in enumerate(prepared) if isinstance(p, bytes)},
            shell.end_timeout_s,
            lambda i, outcome: shell.end_answer(batch.ends[i], outcome),
        )
        results = [transaction_pb2.EndTransactionResult() for _ in answers]
        _fill(results, answers)
        return transaction_pb2.EndTransactionsResponse(results=results).SerializeToString()

    return {
        DataMethod.SEND_HALF_MESSAGE: send_half,
        DataMethod.END_TRANSACTION: end,
        DataMethod.SEND_HALF_MESSAGES: send_halves,
        DataMethod.END_TRANSACTIONS: end_many,
    }


def _fill(
    results: Sequence[transaction_pb2.HalfMessageResult | transaction_pb2.EndTransactionResult],
    answers: Sequence[Any],
) -> None:
    """Each item's result: its response, or the ErrorDetail of its typed error."""
    for result, answer in zip(results, answers, strict=True):
        if isinstance(answer, RaftMQError):
            result.error.CopyFrom(to_detail(answer))
        else:
            result.response.CopyFrom(answer)


def _check_size(n: int, what: str) -> None:
    if not 1 <= n <= MAX_BATCH_ITEMS:
        raise InvalidArgumentError(
            f"a batched transaction request carries 1..{MAX_BATCH_ITEMS} {what}, got {n}: split it"
        )
