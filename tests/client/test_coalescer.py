"""client/coalescer.py: calls made while a request is in flight go together in the next one, one
request in flight per key, each item answered with its own answer or error."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.client.coalescer import Coalescer
from raftmq.common.errors import (
    BrokerUnavailableError,
    InternalError,
    QueueFullError,
    RaftMQError,
)


class Server:
    """The requests a Coalescer sent, answered when the test says (doubles each item; a
    negative item is refused alone)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, list[int], Future[Sequence[int | RaftMQError]]]] = []

    def send(self, key: str, items: list[int]) -> Future[Sequence[int | RaftMQError]]:
        f: Future[Sequence[int | RaftMQError]] = Future()
        self.sent.append((key, items, f))
        return f

    def in_flight(self, key: str) -> int:
        return sum(1 for k, _, f in self.sent if k == key and not f.done())

    def answer(self, i: int) -> None:
        _, items, f = self.sent[i]
        f.set_result([x * 2 if x >= 0 else InternalError(f"refused {x}") for x in items])


def test_calls_during_a_request_go_together_in_the_next() -> None:
    server = Server()
    c: Coalescer[int, int] = Coalescer(server.send, max_items=3, max_waiting=10)
    first = c.submit("a", 1)
    assert [items for _, items, _ in server.sent] == [[1]]  # sent at once
    waiting = [c.submit("a", x) for x in (2, -3, 4, 5)]
    other = c.submit("b", 7)  # another key is not held back
    assert [items for _, items, _ in server.sent] == [[1], [7]]
    server.answer(0)
    assert first.result(0) == 2
    assert [items for _, items, _ in server.sent][2] == [2, -3, 4]  # at most max_items
    server.answer(2)
    assert waiting[0].result(0) == 4 and waiting[2].result(0) == 8
    with pytest.raises(InternalError, match="refused -3"):
        waiting[1].result(0)  # refused alone
    assert [items for _, items, _ in server.sent][3] == [5]
    server.answer(3)
    assert waiting[3].result(0) == 10
    server.answer(1)
    assert other.result(0) == 14
    assert (c.requests, c.items) == (4, 6)
    # Idle again: the next call is sent at once.
    c.submit("a", 6)
    assert server.sent[-1][1] == [6]


def test_a_failed_request_fails_its_items_and_the_next_batch_still_goes() -> None:
    server = Server()
    c: Coalescer[int, int] = Coalescer(server.send)
    a = c.submit("k", 1)
    b = c.submit("k", 2)
    server.sent[0][2].set_exception(BrokerUnavailableError("gone"))
    with pytest.raises(BrokerUnavailableError):
        a.result(0)
    assert server.sent[1][1] == [2]
    server.sent[1][2].set_result([1, 2])  # wrong count: every item fails, none gets another's
    with pytest.raises(InternalError, match="answered 2 of 1"):
        b.result(0)


def test_send_failing_at_once_fails_the_items() -> None:
    def send(key: str, items: list[int]) -> Future[Sequence[int | RaftMQError]]:
        raise BrokerUnavailableError("no connection")

    c: Coalescer[int, int] = Coalescer(send)
    with pytest.raises(BrokerUnavailableError):
        c.submit("k", 1).result(0)
    with pytest.raises(BrokerUnavailableError):
        c.submit("k", 2).result(0)  # not stuck "in flight"


def test_waiting_calls_are_bounded() -> None:
    server = Server()
    c: Coalescer[int, int] = Coalescer(server.send, max_items=2, max_waiting=2)
    c.submit("k", 0)
    c.submit("k", 1)
    c.submit("k", 2)
    with pytest.raises(QueueFullError, match="waiting"):
        c.submit("k", 3)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.sampled_from("ab"), st.integers(-5, 50)), max_size=60))
def test_every_item_gets_its_own_answer_with_one_request_in_flight_per_key(
    steps: list[tuple[bool, str, int]],
) -> None:
    server = Server()
    c: Coalescer[int, int] = Coalescer(server.send, max_items=4, max_waiting=1000)
    calls: list[tuple[int, Future[int]]] = []
    for submit, key, x in steps:
        if submit:
            calls.append((x, c.submit(key, x)))
        else:
            pending = [i for i, (_, _, f) in enumerate(server.sent) if not f.done()]
            if pending:
                server.answer(pending[x % len(pending)])
        assert server.in_flight("a") <= 1 and server.in_flight("b") <= 1
    while any(not f.done() for _, _, f in server.sent):
        server.answer(next(i for i, (_, _, f) in enumerate(server.sent) if not f.done()))
    for x, fut in calls:
        if x >= 0:
            assert fut.result(0) == 2 * x
        else:
            assert isinstance(fut.exception(0), InternalError)
    assert c.items == len(calls)
    assert sorted(x for _, items, _ in server.sent for x in items) == sorted(x for x, _ in calls)
