"""Measures the record batch codec and the dispatcher on 1000 messages of 1 KiB.

Run: .venv/bin/python -m tests.broker.bench_record_batch   (not collected by pytest)
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from functools import partial

from raftmq.broker.dispatch import Dispatcher, PendingState
from raftmq.common.message import Message
from raftmq.common.record_batch import ProduceBatch, ProducerSequence, decode, encode
from raftmq.raftlog.record import Entry

from .test_dispatch import EmptyState

N = 1000
REPEATS = 50


def best_ms(fn: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def dispatch(entry: Entry) -> object:
    return Dispatcher().apply(entry, PendingState(EmptyState()))


def main() -> None:
    plain = ProduceBatch(
        "Orders", 0, 1, tuple(Message("Orders", os.urandom(1024)) for _ in range(N))
    )
    rich = ProduceBatch(
        "Orders",
        0,
        1_700_000_000_000,
        tuple(
            Message(
                "Orders",
                os.urandom(1024),
                "TagA",
                (f"order-{i}",),
                {"region": "eu"},
                0,
                1_700_000_000_000,
                "10.0.0.7:40112",
            )
            for i in range(N)
        ),
        ProducerSequence("producer-1", 0),
    )
    for label, batch in (("plain", plain), ("tag+key+property", rich)):
        data = encode(batch)
        enc, dec = best_ms(partial(encode, batch)), best_ms(partial(decode, data))
        disp = best_ms(partial(dispatch, Entry(1, 1, (data,))))
        print(
            f"{label:>17}: {len(data) / 1024:.0f} KiB  encode {enc:.2f} ms  decode {dec:.2f} ms  "
            f"encode+decode {enc + dec:.2f} ms  dispatch (incl. decode) {disp:.2f} ms"
        )


if __name__ == "__main__":
    main()
