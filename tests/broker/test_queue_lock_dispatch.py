"""Queue lock records (issue 16, orderly consumption) through the codec, the dispatcher and the
store: applied at the entry's time, alike on every replica, kept in lmdb across a restart."""

from __future__ import annotations

from pathlib import Path

import pytest

from raftmq.broker.dispatch import Dispatcher, PendingState
from raftmq.broker.queue_lock import Lease
from raftmq.broker.rows import Applied
from raftmq.broker.store import MessageStore
from raftmq.common.record_batch import (
    Kind,
    MalformedBatchError,
    QueueLockChange,
    QueueLockOp,
    decode,
    encode,
)
from raftmq.raftlog.record import Entry


def change(op: QueueLockOp, client: str, queues: tuple[int, ...], ts: int) -> bytes:
    return encode(QueueLockChange(op, "g", client, "t", queues, ts, 1_000))


def test_codec_round_trip_and_malformed() -> None:
    rec = QueueLockChange(QueueLockOp.UNLOCK, "g", "c-1", "topic", (0, 3, 7), 123, 60_000)
    assert decode(encode(rec)) == rec
    raw = encode(rec)
    with pytest.raises(MalformedBatchError):
        decode(raw[:-2])
    with pytest.raises(MalformedBatchError, match="operation"):
        decode(raw[:2] + b"\x09" + raw[3:])


def apply_all(store: MessageStore, chunks: list[bytes], first_index: int) -> list[Applied]:
    dispatcher, state = Dispatcher(), PendingState(store)
    outs, applied = [], []
    for i, chunk in enumerate(chunks):
        out = dispatcher.apply(Entry(first_index + i, 1, (chunk,)), state)
        state.absorb(out)
        outs.append(out)
        assert isinstance(out.outcomes[0], Applied)
        assert out.outcomes[0].kind is Kind.QUEUE_LOCK
        applied.append(out.outcomes[0])
    store.apply(outs)
    return applied


def granted(a: Applied) -> list[int]:
    assert a.locks is not None
    return sorted(q.queue_id for q in a.locks.granted)


def test_replicas_agree_and_the_store_keeps_leases(tmp_path: Path) -> None:
    chunks = [
        change(QueueLockOp.LOCK, "a", (0, 1), 10_000),
        change(QueueLockOp.LOCK, "b", (1, 2), 10_500),  # 1 is a's
        change(QueueLockOp.UNLOCK, "b", (0,), 10_600),  # not b's: nothing
        change(QueueLockOp.LOCK, "b", (1,), 11_000),  # a's lease (1 s) expired: taken over
        change(QueueLockOp.UNLOCK, "a", (0,), 11_100),
    ]
    answers = []
    for name in ("n0", "n1"):
        with MessageStore(tmp_path / name, map_size_bytes=1 << 26) as store:
            answers.append([(granted(a), a.detail) for a in apply_all(store, chunks, 1)])
    assert answers[0] == answers[1]
    assert [g for g, _ in answers[0]] == [[0, 1], [2], [], [1], [0]]
    with MessageStore(tmp_path / "n0", map_size_bytes=1 << 26) as store:
        assert store.queue_lease("g", "t", 0) is None
        assert store.queue_lease("g", "t", 1) == Lease("b", 12_000)
        assert store.queue_lease("g", "t", 2) == Lease("b", 11_500)
        # A restarted node continues from its store: c is refused while b's lease lives.
        later = apply_all(store, [change(QueueLockOp.LOCK, "c", (1, 2), 11_400)], 6)
        assert granted(later[0]) == []
