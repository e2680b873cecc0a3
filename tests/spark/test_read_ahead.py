"""The source's read-ahead (spark_source/read_ahead.py) with real threads: every item in order,
never more than `depth` made ahead of the consumer, the producer's error after the items before
it, and a consumer that leaves early stops the producer and closes its generator."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from raftmq.spark_source.read_ahead import read_ahead

WAIT_S = 30.0  # a bound on an event wait, never a pause: each wait ends when its event is set


class Source:
    """A producer that counts what it made and tells when its generator was closed."""

    def __init__(self, count: int, fail_after: int | None = None) -> None:
        self.count = count
        self.fail_after = fail_after
        self.made = 0
        self.closed = threading.Event()

    def __call__(self) -> Iterator[int]:
        try:
            for i in range(self.count):
                if i == self.fail_after:
                    raise ConnectionError(f"pull failed at {i}")
                self.made += 1
                yield i
        finally:
            self.closed.set()


@pytest.mark.parametrize("depth", [1, 2, 5])
def test_items_in_order_and_never_more_than_depth_ahead(depth: int) -> None:
    src = Source(2_000)
    seen = []
    for consumed, item in enumerate(read_ahead(src, depth, name="t"), start=1):
        seen.append(item)
        # Made ahead of the consumer: the queue's `depth`, one in the producer's hand (made,
        # waiting for room) and this one. An unbounded read-ahead runs thousands ahead.
        assert src.made - consumed <= depth + 1
    assert seen == list(range(2_000))
    assert src.closed.wait(WAIT_S)


def test_an_error_reaches_the_consumer_after_the_items_before_it() -> None:
    src = Source(100, fail_after=7)
    seen = []
    with pytest.raises(ConnectionError, match="pull failed at 7"):
        for item in read_ahead(src, 2, name="t"):
            seen.append(item)
    assert seen == list(range(7))
    assert src.closed.wait(WAIT_S)


def test_a_consumer_that_leaves_stops_the_producer() -> None:
    src = Source(10**9)  # never ends by itself
    items = read_ahead(src, 2, name="t")
    assert next(items) == 0
    items.close()  # Spark stops reading (a limit, a cancelled task)
    assert src.closed.wait(WAIT_S), "the producer's generator was not closed"
    assert src.made <= 5


def test_depth_is_at_least_one() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        read_ahead(Source(1), 0, name="t")
